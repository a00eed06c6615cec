"""Tensor parallelism: one process per rank, each holding its shard of the model.

`infinilm.distributed.parallel` is the layout (which heads, rows and vocabulary a rank holds), the split check
and the gate problems; `infinilm.distributed.launch` the process group, the followers rank 0 starts and their
handshake; `infinilm.distributed.step` the broadcast of rank 0's scheduled batch. The split layers are in
`infinilm.layers` (`ColumnParallelLinear`, `RowParallelLinear`, `VocabParallelEmbedding`, `ParallelLMHead`).
This package's ``__init__`` imports none of its modules: the layers import the layout while the engine, which
the launch and step modules import, is still being imported.
"""
