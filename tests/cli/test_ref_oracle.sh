#!/usr/bin/env bash
# The independent numpy reference (tests/ref/k3ref.py) against the external
# PyTorch oracle fixture, including its ablations: the reference itself must
# be right before krun is compared with it.
. "$(dirname "$0")/lib.sh"
if [ ! -d "$K3_SHARED/fixtures/k3-tiny-oracle" ]; then
    skip "numpy reference vs oracle: $K3_SHARED/fixtures/k3-tiny-oracle is absent"
    finish; exit 0
fi
K3_SHARED="$K3_SHARED" /usr/bin/python3 "$TOP/tests/ref/test_k3ref_oracle.py" --ablations
rc=$?
finish
exit $rc
