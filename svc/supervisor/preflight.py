"""What the supervisor checks before a start or restart asked through the management API stops anything.

A model's restart stops its process before the new one reads the config; an
edit that no longer loads (its plugin's ``[model]`` keys included) then took
the model down until the file was fixed.
A model's edited ``port`` or ``server_uri`` is worse: the supervisor probes
and the gateway routes by what they read at the supervisor's start, so the
new process answered where nobody asked (``starting`` for good, every request
503 or 404).  And a gateway started on a key file with one bad entry runs in
static-token mode (docs/contract.md, Authentication), refusing every API key,
while its restart answered ``{ok: true}``.  Each check here returns why the
action must not go on (the running process keeps serving), or None.
"""

from __future__ import annotations

import os

from svc.auth import UntrustedKeyFile, cluster_problem, load_trusted_key_file, separate_tokens_problem
from svc.config import ConfigError, ModelServerConfig, load_model_server_config
from svc.supervisor.config import SupervisorConfig, load_supervisor_config

#: The keys the gateway and the supervisor route by, read once at the supervisor's start.
ROUTING_KEYS = ("id", "port", "server_uri")


def model_config_problem(model: ModelServerConfig, device: str = "cpu") -> str | None:
    """Why ``model``'s config file, read again now, must not be started: it does not load, or routes elsewhere.

    ``device`` is the profile's (``cpu`` or ``gpu``), which the model server
    runs on whatever its file says: its ``backend.optimize`` is read for it
    (torch-free; whether this machine can run the mode is the new process's
    to say).
    """
    from svc.model.api import PluginError, factories, plugin_edited
    from svc.model.plugincheck import checked_config
    from svc.model.weights import WeightsError
    from svc.optimize.modes import ModeError, parse_mode

    try:
        now = load_model_server_config(model.path)
        try:
            parse_mode(now.backend.optimize, "cuda" if device == "gpu" else "cpu")
        except ModeError as e:
            raise ConfigError(model.path, "backend.optimize", str(e)) from None
        # The [model] table against its plugin's schema (the plugins import no torch); a weights file is the
        # new process's to look for (a --weights of the profile may replace it), and so are a missing plugin
        # and one whose declarations cannot be used: the new process imports the plugin afresh (a fixed file
        # included, where this process keeps what it imported at its start), and refuses in one line.
        factory = factories().get(now.id)
        if factory is not None and not plugin_edited():  # an edited plugin is the new process's to judge
            checked_config(factory, now.model, model.path, files=False)
    except (ConfigError, OSError) as e:
        return f"{model.id}: its config does not load ({e}): fix the file and try again"
    except (WeightsError, PluginError):
        pass
    changed = [f"{key} {getattr(model, key)!r} -> {getattr(now, key)!r}" for key in ROUTING_KEYS
               if getattr(model, key) != getattr(now, key)]
    if changed:
        return (f"{model.id}: {model.path} changes {', '.join(changed)}: the gateway and the supervisor route by "
                "what they read at the supervisor's start, so restart the supervisor to apply it")
    return None


def gateway_moved(config: SupervisorConfig) -> str | None:
    """Why a restart of the gateway asked through the API must not go on: ``[gateway]`` ``host`` or ``port`` edited
    since the supervisor started (it holds the gateway's socket, bound then: the restart answered ``{ok: true}``
    and the gateway stayed where it was).  A config that no longer loads is the new gateway's to refuse."""
    try:
        now = load_supervisor_config(config.path)
    except (ConfigError, OSError):
        return None
    changed = [f"{key} {old!r} -> {new!r}" for key, old, new in (("host", config.gateway_host, now.gateway_host),
                                                                ("port", config.gateway_port, now.gateway_port))
               if old != new]
    if changed:
        return (f"{config.path} changes [gateway] {', '.join(changed)}: the supervisor holds the gateway's socket, "
                "bound at its start, so restart the supervisor to move it")
    return None


def key_file_problem(path: str) -> str | None:
    """Why a gateway must not be restarted on the key file at ``path``: it exists but cannot be used.

    A missing file is no problem here (the gateway decides: static-token mode
    with a token, refused without), nor is an empty one (zero keys, a warning).
    """
    try:
        load_trusted_key_file(path)
    except ConfigError as e:
        if e.problem == "file not found":
            return None
        fix = ("fix its owner or mode as said" if isinstance(e, UntrustedKeyFile) else
               "fix the file (svcctl keys list checks its entries), or empty it to run on the static token alone")
        return (f"the key file cannot be used ({e}): a gateway started on it would run in static-token mode and "
                "refuse every API key, so none is started (a gateway still running, if any, keeps serving with "
                f"the keys it loaded); {fix}, then start or restart the gateway (the web UI, or POST "
                "/api/v1/servers/__gateway/restart)")
    return None


class GatewayKeyFile:
    """The key file a gateway started now reads, checked before each start (:meth:`problem`).

    ``[gateway] keys_file`` as the config says it now: a restart's gateway reads the edited config, so the file
    read at the supervisor's start was checked while the gateway read another (a probe: a broken new file passed
    the check, and that gateway refused every API key after a restart answered ``{ok: true}``).  :attr:`path` is
    the file the last check passed, the one the gateway started then reads (the status's ``keys_file``, which
    ``svcctl keys`` compares the file it edited with).  A config that does not load keeps the known file: that
    gateway refuses to start, and says why.

    A missing file passes the first check (a gateway run on static tokens alone), but not once a gateway was
    started on a file that existed (:attr:`had_file`): a deleted file, or a ``keys_file`` edited to a name
    that is not there, put the next gateway in static-token mode, refusing every API key, where a broken file
    is refused (a keys probe).
    """

    def __init__(self, config: SupervisorConfig, cwd: str | None) -> None:
        self.config, self.cwd = config, cwd
        self.path = self._absolute(config.gateway_keys_file)
        self.had_file = False

    def _absolute(self, name: str) -> str:
        return os.path.abspath(os.path.join(self.cwd or ".", name))  # the gateway runs in ``cwd``

    def current(self) -> str:
        """The absolute path the config names now."""
        try:
            return self._absolute(load_supervisor_config(self.config.path).gateway_keys_file)
        except (ConfigError, OSError):
            return self.path

    def problem(self) -> str | None:
        """:func:`key_file_problem` of :meth:`current`, or why a missing file is refused; the file becomes
        :attr:`path` when it has none."""
        path = self.current()
        exists = os.path.exists(path)  # a link to nothing is no file either
        found = key_file_problem(path)
        if found is None and not exists and self.had_file:
            found = (f"no key file at {path}: the gateway last started read its API keys from {self.path}, and a "
                     "gateway started now would run in static-token mode and refuse every API key, so none is "
                     "started (a gateway still running, if any, keeps serving with the keys it loaded); restore the "
                     "file, or create an empty one to run on the static token alone, then start or restart the "
                     "gateway (the web UI, or POST /api/v1/servers/__gateway/restart)")
        if found is None:
            self.path, self.had_file = path, exists
        return found


def gateway_refusal(env: dict[str, str], has_peers: bool = False) -> str | None:
    """Why the gateway must not be spawned with this environment (None: fine).

    The same checks the gateway makes at startup (svc.auth), so a refusal is a permanent failure here instead
    of a crash loop there.  ``has_peers``: ``[cluster] peers`` is configured.
    """
    problem = separate_tokens_problem(env) or cluster_problem(env, has_peers)
    return f"{problem} (set it and restart the supervisor)" if problem else None
