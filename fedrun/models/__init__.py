"""The papers' networks, their layers as the analyses group them, and federated BatchNorm.
"""
