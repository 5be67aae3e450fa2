"""The HTTP layer of every process (see docs/ARCHITECTURE.md, "HTTP hardening").

``replies``: JSON replies and header readers; ``limits``: body and
connection limits; ``site``: the site and its access log; ``routes``: what
the three Klein apps share (error replies, configured routes, counting,
metrics); ``client``: the quiet outgoing connection pool.
"""
