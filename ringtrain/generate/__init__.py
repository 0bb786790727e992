"""Generation with a local causal LM, shared by data making and evaluation.

Chat rendering with the target's template (``chat``), prompt files and built-in prompt
sets (``prompts``, ``prompt_sets``), loading the model (``model``, ``local_model``) and
batched greedy generation with a cache of its own (``greedy``, ``batch_decode``).
``ringtrain.data`` (regeneration, synthesis) and ``ringtrain.eval`` both build on it.
"""
