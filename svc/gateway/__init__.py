"""The gateway: authentication, per-key rate limits, routing and the treq proxy."""
