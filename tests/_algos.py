"""Every estimator configuration of the registry the protection tests run over: each algorithm,
and the set-valued ones also in their secure (sum-only) mode."""

ALGOS = {
    "dwf": ("dwf", {}),
    "ewf": ("ewf", {}),
    "minibatch": ("minibatch", {}),
    "aligning": ("aligning", {}),
    "aligning-secure": ("aligning", {"secure_mode": True}),
    "kfed": ("kfed", {}),
    "kfed-secure": ("kfed", {"secure_mode": True}),
    "child-parent": ("child-parent", {}),
    "child-parent-secure": ("child-parent", {"secure_mode": True}),
    "fcm": ("fcm", {}),
    "fcm-secure": ("fcm", {"secure_mode": True}),
    "fcm-fedavg": ("fcm-fedavg", {}),
}
