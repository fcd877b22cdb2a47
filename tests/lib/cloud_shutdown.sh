#!/bin/sh
# An instance's shutdown command on the EC2 fixture (tests/lib/cloud.sh): the tests set
# TANDEM_SHUTDOWN_CMD to this script, so that an instance's dead-man's switch (docs/cloud.md)
# asks the fixture, through the instance's IMDS, to do what EC2 does when an instance shuts
# itself down: terminate it (InstanceInitiatedShutdownBehavior=terminate) or stop it. A real
# `shutdown -h now` would end the test machine: the instances are only namespaces. The reason
# the switch gives (TANDEM_ORPHAN_WHY) goes with the request, for the test to read.
imds=http://169.254.169.254
t=$(curl -sf -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' "$imds/latest/api/token") &&
    curl -sf -X POST -H "X-aws-ec2-metadata-token: $t" \
        --data-binary "${TANDEM_ORPHAN_WHY:-shutdown -h now}" "$imds/fixture/shutdown"
