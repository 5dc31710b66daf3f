"""Hugging Face checkpoints in and out of attnlab's GPT (docs/interop.md).

families.py     which attnlab configurations GPT-2, Llama and DeepSeek-V3 express, and the config translation both ways
state_dicts.py  the tensors' names and layouts between attnlab's state dict and transformers'
hf_load.py      a local Hugging Face model dir read, checked and loaded into a GPT (``model.init_from``)
neutral.py      the parameters a checkpoint lacks (a variant switched on) set to compute the checkpoint's function
export.py       ``attnlab export RUN --format hf OUT``: a run's model written as a transformers dir

attnlab's model is the reference implementation; transformers is needed to write a directory
(save_pretrained) but not to read one (safetensors and config.json are read directly).
"""
