"""autoencoder"""
