"""Inference engines and the models they load.

Today this holds the default model's preparation (:mod:`.default_model`); the engine
protocol, the vLLM adapter and the simulator join it here.
"""
