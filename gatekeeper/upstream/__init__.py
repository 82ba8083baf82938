"""The upstream: the session to the kube-apiserver, its kubeconfig, previews, token reviews."""

__all__: list[str] = []
