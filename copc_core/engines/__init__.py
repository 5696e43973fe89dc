"""The models and the samplers: the tiny GPT (`models.py`), Hugging Face models (`hf.py`), the torch sampler
(`rollout.py`), vLLM (`vllm_engine.py`), and the registry of backends and engines (`backends.py`)."""
