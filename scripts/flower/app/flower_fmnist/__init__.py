"""examples/fashion_mnist_cnn.yaml's job in PyTorch under Flower (Huddle's peer comparison)."""
