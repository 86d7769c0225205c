"""Inference engines and the models they load.

* :mod:`.protocol` — the :class:`~.protocol.Engine` contract every engine implements;
* :mod:`.vllm_engine` — vLLM ``AsyncLLM`` (CPU or GPU), checked by :mod:`.capabilities`;
* :mod:`.sim` — the simulator (CI, capacity planning, routing studies; labelled simulated);
* :mod:`.default_model` — preparation of the default model.

Importing this package imports neither vLLM nor torch.
"""
