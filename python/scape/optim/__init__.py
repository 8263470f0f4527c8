"""The torch-native optimizers of scape (torch ops only; imported through scape.torch)."""
