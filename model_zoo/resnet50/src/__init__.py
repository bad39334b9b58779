"""ResNet-50 model zoo for mindspore_ngd: network, data, configuration, optimizer factory."""
