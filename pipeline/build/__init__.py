"""The build: typed settings, the one source of every build option (config); the orchestrator whose
body is the data flow from a Keras model to a Triton repository (orchestrator); what it needs beside
its stages (support); and publishing into the model repository and the deploy bundle (publish).

May import: core, data, backend, accuracy, models, stages, triton, mig.
"""
