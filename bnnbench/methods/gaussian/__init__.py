"""Gaussian variational families: Bayes by Backprop (reparameterised gradients of the ELBO, Blundell et al., 2015),
the natural-gradient methods VOGN, Vadam and Vprop (Khan et al., 2018) and their MATLAB-faithful variant, SLANG's
low-rank-plus-diagonal precision (Mishkin et al., 2018) and the full-covariance Gaussian; ``mean_field`` and
``natural`` hold what they share."""
