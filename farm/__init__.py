"""ptefarm: a CI device test farm for ExecuTorch LLMs on Qualcomm Snapdragon phones."""

__version__ = "0.1.0"
