"""Policies: loading any model (`load_policy`), LoRA, GGUF conversion, the embedded tiny model, the known
pretrained models, and the prompt format a policy reads and writes (`PromptFormat`)."""
