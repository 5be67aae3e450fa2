"""The command line: ``svcctl`` and the quick start.

- :mod:`svc.cli.commands`: ``svcctl``'s parser and its key commands (the console script);
- :mod:`svc.cli.gateway` and :mod:`svc.cli.jobs`: ``svcctl infer`` and ``svcctl jobs``;
- :mod:`svc.cli.keyfile`: ``svcctl keys``, the key file and the gateway's restart;
- :mod:`svc.cli.args`: argument and token helpers the commands share (a leaf);
- :mod:`svc.cli.http`: the HTTP client, exit codes and failure lines;
- :mod:`svc.cli.quickstart` and :mod:`svc.cli.quickstart_weights`: ``bin/quickstart``.

Nothing below this package imports it: the CLI is the top layer (``.importlinter``).
"""
