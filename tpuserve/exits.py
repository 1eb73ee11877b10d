"""The exit codes of every `tpuserve` command, one meaning each (docs/toolkit.md#exit-codes). Standard library only:
the in-cluster renewer (tpuserve/gke_renewer.py) ends with them too."""

OK = 0  # done: deployed, ready, renewed, nothing due
FAILED = 1  # an error another attempt would meet again: unreachable, refused, a failed gate or preflight
USAGE = 2  # a bad option, setting or file: nothing was done
NO_CAPACITY = 3  # no TPU before the deadline (`up`), or no successor (`renew`): what serves keeps serving
NEEDS_CONSENT = 4  # the change replaces the VM and nobody agreed (`--replace-vm`)
ORPHANS = 5  # done, but something that bills is left that the stack does not hold
NAT_USERS = 6  # `destroy` refused: VMs of other stacks reach the internet through the stack's Cloud NAT
INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
