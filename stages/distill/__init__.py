"""The distill stage: recover what earlier stages cost by training the model so far (the
student) to reproduce the unoptimized model (the teacher). ``stage.py`` holds the config
and the record; ``losses.py`` the losses by output kind; ``loop.py`` the training loop."""
