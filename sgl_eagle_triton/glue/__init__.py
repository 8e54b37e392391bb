"""The glue layer: every place sgl-eagle-triton touches SGLang's internals, in one subpackage.

- :mod:`~sgl_eagle_triton.glue.versions`: the SGLang releases this wheel serves (0.5.17 ... 0.5.23) and the start-up
  refusal outside them;
- :mod:`~sgl_eagle_triton.glue.args`: reading and writing server arguments across SGLang's two configuration models
  (a mutable ``ServerArgs`` up to 0.5.18; from 0.5.19 a raw record resolved once, read through a view);
- :mod:`~sgl_eagle_triton.glue.hooks`: the functions SGLang's plugin hook registry wraps for us, with the parameters
  each hook expects, and their registration;
- :mod:`~sgl_eagle_triton.glue.call_sites`: the module globals we rebind while our workers run, the methods we
  override, the signatures we call, and the start-up check that all of them are still where we expect
  (:func:`~sgl_eagle_triton.glue.call_sites.check_glue`);
- :mod:`~sgl_eagle_triton.glue.relay`: the overlap scheduler's relay (SGLang's ``FutureMap``, subclassed) carrying the
  bonus token alone after a step that only filled the draft KV;
- :mod:`~sgl_eagle_triton.glue.nonspec`: a batch held at adaptive steps 0 turned non-speculative for SGLang's scheduler
  and back (its lengths and KV reservation; SGLang's decode preparation and result processing wrapped), the default
  where it can run.

Version differences are adapters chosen once, by probing the installed SGLang (a signature, an attribute), never
``if version`` checks in the worker, config or verify modules. docs/design.md holds the table of every touchpoint.
``versions`` and ``args`` import nothing heavy (config reads them in the launcher); ``call_sites`` and ``nonspec``
import SGLang's speculative and scheduler modules and are imported by the worker only.
"""
