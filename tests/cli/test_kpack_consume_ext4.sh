#!/usr/bin/env bash
# Issue 36 names it in `make test`: --consume on a loop-mounted ext4 sized for
# "the KPK plus one shard" (it completes; without --consume the conversion is
# refused before it starts).  The test is tests/root/test_consume_ext4.sh (also
# run by `make test-root`); without root or loop devices it says skip.
exec bash "$(dirname "$0")/../root/test_consume_ext4.sh"
