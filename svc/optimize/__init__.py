"""Optimised execution of a model's forward pass (``backend.optimize``), one module per job.

- :mod:`svc.optimize.modes`: the modes, the parsing and checking of the key (torch-free);
- :mod:`svc.optimize.support`: what this machine can run (native bf16, a C++ compiler);
- :mod:`svc.optimize.apply`: applying a mode to one target (``nn.Module`` + example inputs);
- :mod:`svc.optimize.standin`: the modules an optimised target is made of;
- :mod:`svc.optimize.gates`: the accuracy gates, one comparison per task category;
- :mod:`svc.optimize.select`: the step of a model load: gate, time, choose, log one line, fall back;
- :mod:`svc.optimize.report`: what that step reports (each candidate's outcome, the mode, the line);
- :mod:`svc.optimize.choices`: ``auto``'s choice recorded on disk, so that a restart does not measure again;
- :mod:`svc.optimize.aot`: ``compile``: export, AOTInductor, packages keyed and cached on disk;
- :mod:`svc.optimize.runtimes`: ``openvino`` / ``onnxruntime``: the target converted at load, cached on disk;
- :mod:`svc.optimize.cache`: the state directory, its ``compiled/`` and ``inductor/`` (torch-free);
- :mod:`svc.optimize.prune`: ``svcctl cache list|prune``: the compiled cache's artefacts by last use (torch-free);
- :mod:`svc.optimize.buckets`: batch-shape buckets (pad to a captured size, slice back);
- :mod:`svc.optimize.cudagraphs`: CUDA graphs per bucket (GPU only);
- :mod:`svc.optimize.transfer`: pinned-memory host-to-device batches (GPU only).

Plugins opt in with ``svc.model.api.IOptimizable``; nothing here names a model.
"""
