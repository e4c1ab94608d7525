"""The reproductions about the data itself rather than a paper's method: MNIST's first 10,000 training
images (mnist_train10k.py writes dataset=mnist_train10k's files), what CIFAR-10's JPEG copy costs a model
(cifar10_jpeg_cost.py, claims_cifar10_jpeg.py) and FEMNIST on LEAF's writers (claims_femnist_leaf.py)."""
