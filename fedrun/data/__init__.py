"""Data: loaders (:mod:`.datasets`) apart from preparation (:mod:`.preparation`: validation split,
normalization, the device), partitions across clients, augmentation.
"""
