"""How the weights move: the parameter groups (one function, every parameter in exactly one group), Muon and AdamW,
the learning-rate schedule, and what an autoresume may change of them."""
