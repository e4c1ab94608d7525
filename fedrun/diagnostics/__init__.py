"""What a round measures: N and E per layer (FedNNNN), parameter divergence (PD-Ls, PD-VL),
evaluation of the models, and loss surfaces.
"""
