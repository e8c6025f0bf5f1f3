"""Global inducing point posteriors (Ober & Aitchison, 2020) and the posterior families they are compared with.

A network is a list of layers; each layer's weights W_l (bias as an extra input row) have a prior (``priors``) and an
approximate posterior family (``layers``): factorised (mean-field), local inducing (the weight posterior is Bayesian
linear regression on the layer's own learned pseudo-data), global inducing (the same regression on *propagated*
inducing inputs: learned inputs U_0 run through the sampled network beside the data, so a layer's posterior depends on
the weights sampled below it), or the prior itself (``rand -> gi``'s lower layers). ``network`` runs the layers on the
replica and sample axes and returns the outputs with the single-sample estimate of log p(W) - log q(W) that the ELBO
needs; ``blr`` holds the regression; ``gamma`` the Gamma draws of the Scale prior.
"""
