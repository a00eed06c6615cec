"""Model families: each module declares its families (`infinilm.models.family.ModelFamily`); `registry` lists them.

`decoder` holds the attention decoder the Llama-like families share and `decoder_config` its config
translation and gate problems; each other module is one family (or, for `llama`, the three that differ only
as data) with what is particular to it.
"""
