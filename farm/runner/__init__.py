"""The host runner: qnn_llama_runner's flags and outputs on the host CPU (farm/runner/cli.py)."""

# The runner's command name, here so that the modules a run starts through (the zygote's client, the
# device's runner wrapper) name it without importing the CLI's flag tables.
PROG = "farm-llama-runner"
