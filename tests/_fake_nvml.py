"""A faked pynvml for the tests that ask NVML about GPU topology (tests/patches, tests/host/test_serve.py);
`_fake_nvml`, as tests/conftest.py puts tests/ on sys.path."""

from types import SimpleNamespace

# PCI bus ids of an 8-GPU two-socket box: GPUs 0-3 under socket 0, 4-7 under socket 1 (sysfs spelling).
BUS = [f"0000:{b}1:00.0" for b in "02468ace"]  # 0000:01:00.0, 0000:21:00.0, ... 0000:e1:00.0


class FakeNvml:
    """The pynvml calls SGLang's launcher and the doctor make, for `count` GPUs: index i on PCI bus `buses[i]`
    (sysfs spelling), named `names[i]`, UUID `uuid(i)`; `nvlink`: NVLink-joined index pairs; `init_error` /
    `pair_error`: what nvmlInit / the NVLink query raises; `pairs`, `inits`: what was asked. Other P2P answers OK."""

    def __init__(self, monkeypatch, count=8, nvlink=(), init_error=None, pair_error=None, buses=None, names=None):
        import pynvml

        self.pynvml, self.count, self.init_error, self.pair_error = pynvml, count, init_error, pair_error
        self.buses = list(buses or BUS[:count])
        self.names = list(names or ["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * count)
        self.nvlink = {frozenset(p) for p in nvlink}
        self.pairs: set[frozenset] = set()
        self.inits = 0
        device = "Count HandleByIndex P2PStatus PciInfo UUID Name".split()
        for name in ["nvmlInit", "nvmlShutdown", "nvmlSystemGetDriverVersion", *(f"nvmlDeviceGet{d}" for d in device)]:
            monkeypatch.setattr(pynvml, name, getattr(self, name))

    @staticmethod
    def uuid(i: int) -> str:
        return f"GPU-{i:x}{i:x}{i:x}{i:x}0e1f-2a3b-4c5d-6e7f-8091a2b3c4d{i:x}"

    def nvmlInit(self):
        self.inits += 1
        if self.init_error is not None:
            raise self.pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "580.95.05"

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < self.count:
            raise self.pynvml.NVMLError(self.pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ("gpu", i)

    def nvmlDeviceGetPciInfo(self, handle):
        domain, rest = self.buses[handle[1]].split(":", 1)
        return SimpleNamespace(busId=f"0000{domain}:{rest}".upper().encode())  # NVML: 00000000:C1:00.0

    def nvmlDeviceGetUUID(self, handle):
        return self.uuid(handle[1])

    def nvmlDeviceGetName(self, handle):
        return self.names[handle[1]]

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        if index != self.pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
            return self.pynvml.NVML_P2P_STATUS_OK  # P2P read: fine everywhere
        self.pairs.add(frozenset((a[1], b[1])))
        if self.pair_error is not None:
            raise self.pynvml.NVMLError(self.pair_error)
        if frozenset((a[1], b[1])) in self.nvlink:
            return self.pynvml.NVML_P2P_STATUS_OK
        return self.pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
