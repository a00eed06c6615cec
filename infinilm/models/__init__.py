"""Model families: each module declares its families (`infinilm.models.family.Family`); `registry` lists them.

`decoder` holds the attention decoder the Llama-like families share (`decoder_config` its config translation and
gate problems); `llama` declares Llama, Qwen2 and Qwen3 on it; `mamba2` the recurrent Mamba-2.
"""
