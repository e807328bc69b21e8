"""The hardware queues through which a GPU receives kernels, and how streams share them.

A runtime does not give every stream a hardware queue: HIP spreads its streams over
``GPU_MAX_HW_QUEUES`` queues (4 by default) and CUDA over ``CUDA_DEVICE_MAX_CONNECTIONS``
connections (8 by default).  The first streams get a queue each; every later stream shares the
queue with the fewest streams, the earliest created on ties (round robin).  Kernel dispatch packets
carry a barrier, so a queue starts a kernel only when its previous kernel has completed, whatever
streams they came from: streams that share a queue are serialized (false dependencies), and at most
``count`` kernels from unmasked streams run at once.  A stream with a CU mask gets a queue of its
own, because the mask is a property of the queue.
"""

from __future__ import annotations

import simpy


class HardwareQueues:
    """One GPU's hardware queues and the streams mapped onto them.

    Parameters
    ----------
    env
        The simpy environment.
    count
        Queues shared by streams without a CU mask.
    """

    def __init__(self, env: simpy.Environment, count: int):
        if count < 1:
            raise ValueError(f"a GPU needs at least one hardware queue, got {count}")
        self.env = env
        self.count = count
        self.shared: list[simpy.Resource] = []
        self.users: list[int] = []
        self.of_stream: dict[str, simpy.Resource] = {}

    def queue(self, stream: str, masked: bool = False) -> simpy.Resource:
        """The queue of ``stream`` (assigned at its first kernel); ``masked``: it has a CU mask."""
        queue = self.of_stream.get(stream)
        if queue is not None:
            return queue
        if masked:
            queue = simpy.Resource(self.env, capacity=1)
        elif len(self.shared) < self.count:
            queue = simpy.Resource(self.env, capacity=1)
            self.shared.append(queue)
            self.users.append(1)
        else:
            index = self.users.index(min(self.users))
            self.users[index] += 1
            queue = self.shared[index]
        self.of_stream[stream] = queue
        return queue
