"""The supervisor: spawns and watches the gateway and the model servers,
serves the management API under /api/v1/ and the web UI.  It never imports
torch."""
