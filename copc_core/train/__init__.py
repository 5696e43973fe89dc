"""The training loop: the learner step (`learner.py`), the controlled-lag trainer (`trainer.py`), the SFT warm
start (`warmstart.py`), collapse and the run summary (`stability.py`), and the run presets (`run_presets.py`)."""
