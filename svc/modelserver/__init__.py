"""The model server: one loopback process per catalog model."""
