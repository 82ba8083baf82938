"""The upstream: the session to the kube-apiserver, its kubeconfig, previews, and the
TokenReview and CertificateSigningRequest exchanges."""

__all__: list[str] = []
