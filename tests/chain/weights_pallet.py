"""The weight rules of subtensor's pallet, as the FAKE node of tests/chain_node.rs applies them.

This is not subtensor: it is a small state machine written from the pallet's source as read
(`pallets/subtensor/src/subnets/weights.rs`: `do_set_weights`, `do_commit_weights`,
`do_reveal_weights` and their helpers; the `set_weights` dispatch refusing while commit-reveal
is on). It says nothing about what a running chain accepts; it lets a test watch iota's
validator go through the same refusals a chain would give.

Not modelled: the minimum stake to set weights, the minimum number of weights, the max-weight
limit, mechanisms other than the subnet's first, and the timelocked (v3/v4) commits.

One subnet, one state. Every call returns the pallet events it deposits, or raises `Refused`
with the name of the pallet error (which the node turns into an `ExtrinsicFailed` event).
A reveal's hash is the Bittensor SDK's own `generate_weight_hash`, so a reveal is accepted
only if it hashes, the SDK's way, to what was committed.
"""

from bittensor.utils.weight_utils import generate_weight_hash

U16_MAX = 65535
# The pallet's limit of unrevealed commits per hotkey.
MAX_UNREVEALED_COMMITS = 10


class Refused(Exception):
    """A dispatch the pallet refuses; `args[0]` is the pallet error's name."""


class Subnet:
    """One subnet: its settings, its neurons by uid, their weights and pending commits.

    neurons: [{hotkey (32 bytes), ss58, coldkey, stake, permit, incentive}]; uid = index.
    """

    def __init__(self, netuid, settings, neurons):
        self.netuid = netuid
        self.tempo = settings["tempo"]
        self.commit_reveal = settings["commit_reveal"]
        self.reveal_period = settings["reveal_period_epochs"]
        self.rate_limit = settings["weights_rate_limit"]
        self.version_key = settings["version_key"]
        self.burn = settings.get("burn", 0)
        self.neurons = neurons
        self.last_update = [0] * len(neurons)
        self.weights = {}  # uid -> [(uid, value)]
        self.commits = {}  # hotkey bytes -> [(hash hex, commit block)]
        # What was set, for the test: one entry per successful set or reveal.
        self.history = []

    def uid_of(self, hotkey):
        for uid, n in enumerate(self.neurons):
            if n["hotkey"] == hotkey:
                return uid
        return None

    def epoch(self, block):
        """The pallet's `get_epoch_index`."""
        return (block + self.netuid + 1) // (self.tempo + 1)

    def rate_limit_passes(self, uid, block):
        """The pallet's `check_rate_limit`: never set, or at least the limit ago."""
        last = self.last_update[uid]
        return last == 0 or block - last >= self.rate_limit

    def reveal_blocks(self, commit_block):
        """The pallet's `get_reveal_blocks`: the first and last block of the reveal epoch."""
        epoch = self.epoch(commit_block) + self.reveal_period
        first = epoch * (self.tempo + 1) - (self.netuid + 1)
        return first, first + self.tempo

    def expired(self, commit_block, block):
        return self.epoch(block) > self.epoch(commit_block) + self.reveal_period

    def set_weights(self, hotkey, netuid, uids, values, version_key, block):
        """The `set_weights` dispatch: refused while commit-reveal is on."""
        if self.commit_reveal:
            raise Refused("CommitRevealEnabled")
        return self.do_set_weights(hotkey, netuid, uids, values, version_key, block, "set_weights")

    def do_set_weights(self, hotkey, netuid, uids, values, version_key, block, via):
        if len(uids) != len(values):
            raise Refused("WeightVecNotEqualSize")
        if netuid != self.netuid:
            raise Refused("SubNetworkDoesNotExist")
        if len(uids) > len(self.neurons):
            raise Refused("UidsLengthExceedUidsInSubNet")
        uid = self.uid_of(hotkey)
        if uid is None:
            raise Refused("HotKeyNotRegisteredInSubNet")
        if self.version_key != 0 and version_key < self.version_key:
            raise Refused("IncorrectWeightVersionKey")
        if not self.commit_reveal and not self.rate_limit_passes(uid, block):
            raise Refused("SettingWeightsTooFast")
        self_weight = len(values) == 1 and uids[0] == uid
        if not self_weight and not self.neurons[uid]["permit"]:
            raise Refused("NeuronNoValidatorPermit")
        if len(set(uids)) != len(uids):
            raise Refused("DuplicateUids")
        if any(u >= len(self.neurons) for u in uids):
            raise Refused("UidVecContainInvalidOne")
        # The pallet stores the weights max-upscaled (the largest at u16::MAX).
        top = max(values) if values else 0
        scaled = [v if top == 0 else v * U16_MAX // top for v in values]
        self.weights[uid] = list(zip(uids, scaled))
        if not self.commit_reveal:
            self.last_update[uid] = block
        self.history.append(
            {"block": block, "uid": uid, "via": via, "uids": list(uids), "values": scaled}
        )
        return [("WeightsSet", [self.netuid, uid])]

    def commit_weights(self, hotkey, netuid, commit_hash, block):
        if netuid != self.netuid:
            raise Refused("SubNetworkDoesNotExist")
        if not self.commit_reveal:
            raise Refused("CommitRevealDisabled")
        uid = self.uid_of(hotkey)
        if uid is None:
            raise Refused("HotKeyNotRegisteredInSubNet")
        if not self.rate_limit_passes(uid, block):
            raise Refused("CommittingWeightsTooFast")
        commits = self.commits.setdefault(hotkey, [])
        while commits and self.expired(commits[0][1], block):
            commits.pop(0)
        if len(commits) >= MAX_UNREVEALED_COMMITS:
            raise Refused("TooManyUnrevealedCommits")
        commits.append((commit_hash, block))
        self.last_update[uid] = block
        return [("WeightsCommitted", ["0x" + hotkey.hex(), self.netuid, commit_hash])]

    def reveal_weights(self, hotkey, ss58, netuid, uids, values, salt, version_key, block):
        if netuid != self.netuid:
            raise Refused("SubNetworkDoesNotExist")
        if not self.commit_reveal:
            raise Refused("CommitRevealDisabled")
        commits = self.commits.get(hotkey)
        if not commits:
            raise Refused("NoWeightsCommitFound")
        expired = []
        while commits and self.expired(commits[0][1], block):
            expired.append(commits.pop(0)[0])
        provided = generate_weight_hash(
            address=ss58,
            netuid=netuid,
            uids=list(uids),
            values=list(values),
            version_key=version_key,
            salt=list(salt),
        )
        if not commits:
            raise Refused("ExpiredWeightCommit" if provided in expired else "NoWeightsCommitFound")
        position = next((i for i, c in enumerate(commits) if c[0] == provided), None)
        if position is None:
            raise Refused(
                "ExpiredWeightCommit" if provided in expired else "InvalidRevealCommitHashNotMatch"
            )
        commit_block = commits[position][1]
        if self.epoch(block) != self.epoch(commit_block) + self.reveal_period:
            raise Refused("RevealTooEarly")
        del commits[: position + 1]
        events = self.do_set_weights(
            hotkey, netuid, uids, values, version_key, block, "reveal_weights"
        )
        self.history[-1]["commit_block"] = commit_block
        return events + [("WeightsRevealed", ["0x" + hotkey.hex(), self.netuid, provided])]
