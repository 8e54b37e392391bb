"""Which synchronizing CUDA operations a server's processes run, and from where (a diagnostic, no part of the plugin).

Put this folder first on ``PYTHONPATH`` and set ``SYNC_DEBUG_OUT=<dir>`` for the servers (``bench.adaptive`` passes
its environment on): every Python process that initialises CUDA then turns on torch's sync debug mode
(``torch.cuda.set_sync_debug_mode(1)``: a warning at each operation that makes the host wait for the GPU: ``.item()``,
``.tolist()`` or ``.cpu()`` of a device tensor, a copy to pageable memory, ``nonzero``, a stream or device
synchronize; not ``Event.synchronize``), counts those warnings by call stack (the innermost nine frames; ``loop``
when a scheduler ``event_loop*`` is on the stack, else ``init``) and writes the counts every 5 s to
``<dir>/<pid>.json``. ``python tools/sync_debug/summarize.py <dir>`` lists them per process. A host wait inside the
serving loop stalls the overlap scheduler's launch of the next step by the GPU time still queued.
"""
import os

_out = os.environ.get("SYNC_DEBUG_OUT")
if _out:
    import collections
    import json
    import sys
    import threading
    import time
    import traceback
    import warnings

    _counts = collections.Counter()
    _installed = [False]

    def _key():
        st = traceback.extract_stack()[:-3]
        loop = any(f.name.startswith("event_loop") for f in st)
        frames = [f for f in st if "warnings" not in f.filename]
        tail = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in reversed(frames[-9:]))
        return ("loop " if loop else "init ") + tail

    def _show(message, category, filename, lineno, file=None, line=None, _orig=warnings.showwarning):
        if "synchroniz" in str(message):
            _counts[_key()] += 1
            return
        return _orig(message, category, filename, lineno, file, line)

    def _write():
        """This process's counts to ``<SYNC_DEBUG_OUT>/<pid>.json`` (replaced whole)."""
        os.makedirs(_out, exist_ok=True)
        path = os.path.join(_out, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"argv": sys.argv, "counts": dict(_counts)}, f, indent=0)
        os.replace(path + ".tmp", path)

    def _dump():
        while True:
            time.sleep(5)
            if _counts:
                _write()

    def _hook():
        """Count the sync debug mode's warnings (every one: not once per place) instead of printing them."""
        warnings.filterwarnings("always", message=".*synchroniz.*")
        warnings.showwarning = _show

    def _install():
        if _installed[0]:
            return
        _installed[0] = True
        import torch
        _hook()
        torch.cuda.set_sync_debug_mode(1)
        threading.Thread(target=_dump, daemon=True).start()

    class _Finder:  # install once torch is imported (not before: most processes never import it)
        def find_spec(self, name, path=None, target=None):
            if name == "torch.cuda" and not _installed[0]:
                def later():
                    while True:  # only once this process has initialised CUDA itself
                        time.sleep(0.5)
                        cuda = sys.modules.get("torch.cuda")
                        if cuda is not None and hasattr(cuda, "is_initialized") and cuda.is_initialized():
                            _install()
                            return
                threading.Thread(target=later, daemon=True).start()
            return None

    sys.meta_path.insert(0, _Finder())
