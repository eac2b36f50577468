"""Huddle's PyTorch jobs (the CNN of examples/fashion_mnist_cnn.yaml, the MLP of
examples/fashion_mnist.yaml) under Flower, for Huddle's peer comparison."""
