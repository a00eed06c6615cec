"""CUDA graphs of engine steps: the shared capture (`capture`), decode steps (`decode`), single-prompt prefills
(`prefill`), and the probe that names an implementation which synchronizes with the host (`host_sync`)."""
