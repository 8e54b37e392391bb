"""A stand-in for :class:`sgl_eagle_triton.devtools.launcher.Server` in the benchmarks' CPU tests: records what a sweep
starts (its flags), waits for and stops, in order."""

from types import SimpleNamespace


class ServerLog:
    """``server_class()``: a ``Server`` look-alike whose instances (url = name) record into ``started`` (each one's
    argument list), ``envs`` (each one's environment), ``programs`` (each one's command prefix), ``events``
    (``("start" | "ready" | "post <path>" | "stop", name)`` in order) and ``stopped`` (names); ``/server_info``
    answers ``state`` as its ``internal_states[0]``, ``log()`` ``log_text``."""

    def __init__(self, state: dict | None = None, log_text: str = ""):
        self.started, self.envs, self.events, self.stopped, self.programs = [], [], [], [], []
        self.state, self.log_text = state or {}, log_text

    def server_class(self):
        log = self

        class FakeServer:
            def __init__(self, name, model, args, workdir, env=None, program=None):
                self.name = self.url = name
                self.proc = SimpleNamespace(pid=1000 + len(log.started))  # its session's process group
                log.started.append(args)
                log.envs.append(env or {})
                log.programs.append(program)
                log.events.append(("start", name))

            def wait_ready(self, timeout_s):
                log.events.append(("ready", self.name))

            def get_json(self, path):
                return {"internal_states": [log.state]}

            def log(self):
                return log.log_text

            def post(self, path, body):
                log.events.append(("post " + path, self.name))
                return ""

            def stop(self):
                log.stopped.append(self.name)
                log.events.append(("stop", self.name))

        return FakeServer
