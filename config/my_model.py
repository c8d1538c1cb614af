# Your own model (examples/my_model.py) trained by the same pipeline as model.py's GPT: config/tiny.py's data,
# batch and schedule, the model named by import path with its constructor's arguments (docs/extending.md).
#   python train.py config/my_model.py
#   python sample.py --checkpoint runs/my_model --model-class examples.my_model:MyGPT

base = "tiny.py"

model_class = "examples.my_model:MyGPT"
model_args = {"vocab_size": 50257, "block_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 64}
