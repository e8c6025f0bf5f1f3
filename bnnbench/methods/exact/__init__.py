"""Exact Gaussian variational inference for Bayesian logistic regression: the full and mean-field optima by L-BFGS
(``exact_vi``), the solved methods that return them (``exact_gaussian``) and SLANG Table 1's metrics of any Gaussian
q against them (``logreg``)."""
