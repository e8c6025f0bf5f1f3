"""Global inducing point posteriors (Ober & Aitchison, 2020) and the posterior families they are compared with.

A network is a sequence of ``modules`` (``architectures``: the protocol's MLP, the MNIST-500 CNN, ResNet-8); each
weight layer's weights W_l (fully connected: the bias as an extra input row; convolutions: patches, no bias) have a
prior (``priors``; the spatial Inverse-Wishart one of convolutions through ``wishart`` and ``precision``) and an
approximate posterior family (``layers``, ``conv_layers``): factorised (mean-field), local inducing (the weight
posterior is Bayesian linear regression on the layer's own learned pseudo-data), global inducing (the same regression
on *propagated* inducing inputs: learned inputs U_0 run through the sampled network beside the data, so a layer's
posterior depends on the weights sampled below it), or the prior itself (``rand -> gi``'s lower layers). ``network``
runs the layers on the replica and sample axes and returns the outputs with the single-sample estimate of
log p(W) - log q(W) that the ELBO needs; ``blr`` holds the regression (``autocorrelation`` its convolutional
statistics, App. A); ``gamma`` the Gamma draws of the Scale prior and of the Bartlett decomposition.
"""
