"""The clients: local training (its optimizers, the methods' regularizers, who trains how long)
and the engines that run it, one client at a time or a round's clients at once.
"""
