"""Vulkan instance and device: choice, validation, submission and deferred frees.

Rules:

* ``TRACKER_VULKAN_DEVICE`` picks the device by index or by a case-insensitive
  substring of its name; without it a discrete GPU is preferred, then an
  integrated or virtual GPU, then the CPU device (lavapipe).
* ``TRACKER_VULKAN_VALIDATION=1`` enables ``VK_LAYER_KHRONOS_validation``; its
  messages go to the ``gpu.validation`` logger (errors at ERROR, the rest at WARNING).
* Every submission gets a serial and a fence. ``defer(serial, fn)`` runs ``fn`` once
  that serial's fence has signalled, so memory is never returned while the GPU may
  still read it; ``close()`` waits for the device to go idle first.
* Objects are context managers; ``close()`` is idempotent; cleanup of objects that
  were never closed runs from ``weakref.finalize`` (never ``__del__``).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from gpu.errors import ClosedError, DeviceLost, GpuError, VulkanUnavailable

log = logging.getLogger("gpu")
validation_log = logging.getLogger("gpu.validation")

ENV_DEVICE = "TRACKER_VULKAN_DEVICE"
ENV_VALIDATION = "TRACKER_VULKAN_VALIDATION"
VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
HOST_IMPORT = "VK_EXT_external_memory_host"
_TYPE_NAMES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}
_TYPE_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "other": 4}
_FENCE_TIMEOUT_NS = 120 * 10**9


def load_vulkan() -> ModuleType:
    """The ``vulkan`` binding; VulkanUnavailable naming the package when it cannot load."""
    try:
        import vulkan
    except OSError as exc:
        raise VulkanUnavailable(
            f"no Vulkan loader (libvulkan.so.1): {exc}; install the Debian package libvulkan1 "
            "(apt-get install libvulkan1 mesa-vulkan-drivers)",
            package="libvulkan1",
        ) from None
    except ImportError:
        raise VulkanUnavailable(
            "the Python package 'vulkan' is not installed; pip install 'vulkan==1.3.275.1' "
            "(the project's [vulkan] extra)",
            package="vulkan",
        ) from None
    return vulkan


@dataclass(frozen=True)
class DeviceInfo:
    """What one physical device is and the limits the library designs against."""

    index: int
    name: str
    type: str
    api_version: str
    max_push_constants_size: int
    max_storage_buffer_range: int
    min_storage_buffer_offset_alignment: int
    max_workgroup_count: tuple[int, int, int]
    max_workgroup_invocations: int
    max_workgroup_size: tuple[int, int, int]
    max_shared_memory: int
    non_coherent_atom_size: int
    timestamp_period_ns: float
    shader_int64: bool
    shader_float64: bool
    storage_buffer_16bit: bool
    subgroup_size: int
    host_import_alignment: int
    max_texel_buffer_elements: int
    min_texel_buffer_offset_alignment: int


def _describe(vk: ModuleType, pd: Any, index: int) -> DeviceInfo:
    p = vk.vkGetPhysicalDeviceProperties(pd)
    lim = p.limits
    f = vk.vkGetPhysicalDeviceFeatures(pd)
    s16 = vk.VkPhysicalDevice16BitStorageFeatures()
    vk.vkGetPhysicalDeviceFeatures2(pd, vk.VkPhysicalDeviceFeatures2(pNext=s16))
    sub = vk.VkPhysicalDeviceSubgroupProperties()
    vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=sub))
    import_alignment = 0
    if HOST_IMPORT in {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(pd, None)}:
        host = vk.VkPhysicalDeviceExternalMemoryHostPropertiesEXT()
        vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=host))
        import_alignment = int(host.minImportedHostPointerAlignment)
    v = p.apiVersion
    return DeviceInfo(
        index=index,
        name=p.deviceName,
        type=_TYPE_NAMES.get(p.deviceType, "other"),
        api_version=f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}",
        max_push_constants_size=lim.maxPushConstantsSize,
        max_storage_buffer_range=lim.maxStorageBufferRange,
        min_storage_buffer_offset_alignment=lim.minStorageBufferOffsetAlignment,
        max_workgroup_count=tuple(lim.maxComputeWorkGroupCount),  # type: ignore[arg-type]
        max_workgroup_invocations=lim.maxComputeWorkGroupInvocations,
        max_workgroup_size=tuple(lim.maxComputeWorkGroupSize),  # type: ignore[arg-type]
        max_shared_memory=lim.maxComputeSharedMemorySize,
        non_coherent_atom_size=lim.nonCoherentAtomSize,
        timestamp_period_ns=float(lim.timestampPeriod),
        shader_int64=bool(f.shaderInt64),
        shader_float64=bool(f.shaderFloat64),
        storage_buffer_16bit=bool(s16.storageBuffer16BitAccess),
        subgroup_size=int(sub.subgroupSize),
        host_import_alignment=import_alignment,
        max_texel_buffer_elements=lim.maxTexelBufferElements,
        min_texel_buffer_offset_alignment=lim.minTexelBufferOffsetAlignment,
    )


def _create_instance(vk: ModuleType, validation: bool) -> tuple[Any, Any]:
    """(instance, messenger create info or None); raises VulkanUnavailable when it cannot."""
    layers: list[str] = []
    extensions: list[str] = []
    messenger_info = None
    if validation:
        have = {layer.layerName for layer in vk.vkEnumerateInstanceLayerProperties()}
        if VALIDATION_LAYER not in have:
            raise VulkanUnavailable(
                f"{ENV_VALIDATION}=1 but {VALIDATION_LAYER} is not installed; "
                "install the Debian package vulkan-validationlayers or unset the variable",
                package="vulkan-validationlayers",
            )
        layers = [VALIDATION_LAYER]
        extensions = ["VK_EXT_debug_utils"]
        messenger_info = vk.VkDebugUtilsMessengerCreateInfoEXT(
            messageSeverity=vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
            messageType=vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
            pfnUserCallback=_on_validation_message,
        )
    app = vk.VkApplicationInfo(
        pApplicationName="gpu", applicationVersion=1, pEngineName="gpu", engineVersion=1,
        apiVersion=vk.VK_MAKE_VERSION(1, 2, 0),
    )
    info = vk.VkInstanceCreateInfo(
        pNext=messenger_info, pApplicationInfo=app,
        ppEnabledLayerNames=layers or None, ppEnabledExtensionNames=extensions or None,
    )
    try:
        return vk.vkCreateInstance(info, None), messenger_info
    except (vk.VkErrorIncompatibleDriver, vk.VkErrorInitializationFailed):
        raise VulkanUnavailable(
            "no Vulkan driver (ICD) found; install the Debian package mesa-vulkan-drivers "
            "for the lavapipe CPU device, or your GPU vendor's driver",
            package="mesa-vulkan-drivers",
        ) from None


def _on_validation_message(severity: int, types: int, data: Any, user: Any) -> int:
    vk = load_vulkan()
    message = vk.ffi.string(data.pMessage).decode("utf-8", "replace") if data.pMessage else ""
    level = logging.ERROR if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT else logging.WARNING
    validation_log.log(level, "%s", message)
    return 0


def _physical_devices(vk: ModuleType, instance: Any) -> list[Any]:
    devices = list(vk.vkEnumeratePhysicalDevices(instance))
    if not devices:
        raise VulkanUnavailable(
            "the Vulkan loader found no device; install the Debian package mesa-vulkan-drivers "
            "(lavapipe CPU device) or a GPU driver",
            package="mesa-vulkan-drivers",
        )
    return devices


def list_devices() -> list[DeviceInfo]:
    """Every Vulkan device the loader sees (a temporary instance is created and destroyed)."""
    vk = load_vulkan()
    instance, _ = _create_instance(vk, validation=False)
    try:
        return [_describe(vk, pd, i) for i, pd in enumerate(_physical_devices(vk, instance))]
    finally:
        vk.vkDestroyInstance(instance, None)


def choose(infos: list[DeviceInfo], selector: str | int | None) -> DeviceInfo:
    """The device ``selector`` names (index or name substring), else the preferred one."""
    if selector is None or str(selector).strip() == "":
        return min(infos, key=lambda d: (_TYPE_RANK[d.type], d.index))
    text = str(selector).strip()
    listing = "; ".join(f"{d.index}: {d.name} ({d.type})" for d in infos)
    if text.isdigit():
        index = int(text)
        if index >= len(infos):
            raise GpuError(f"{ENV_DEVICE}={text!r}: no Vulkan device {index}; available: {listing}")
        return infos[index]
    matches = [d for d in infos if text.lower() in d.name.lower()]
    if not matches:
        raise GpuError(f"{ENV_DEVICE}={text!r} matches no Vulkan device; available: {listing}")
    return min(matches, key=lambda d: (_TYPE_RANK[d.type], d.index))


@functools.lru_cache(maxsize=8)
def _probe(selector: str) -> tuple[bool, str]:
    try:
        info = choose(list_devices(), selector or None)
    except GpuError as exc:
        return False, str(exc)
    return True, f"{info.name} ({info.type}, Vulkan {info.api_version})"


def available() -> tuple[bool, str]:
    """``(True, device description)`` when a Vulkan device can be used, else ``(False, why)``."""
    return _probe(os.environ.get(ENV_DEVICE, ""))


def validation_requested() -> bool:
    """Whether ``TRACKER_VULKAN_VALIDATION`` asks for the validation layer."""
    return os.environ.get(ENV_VALIDATION, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class _Inflight:
    serial: int
    fence: Any
    command_buffer: Any
    on_complete: list[Callable[[], None]]


@dataclass
class _State:
    """The raw handles; what the finalizer destroys. Holds no reference to the Device."""

    vk: Any = None
    instance: Any = None
    messenger: Any = None
    device: Any = None
    command_pool: Any = None
    pipeline_cache: Any = None
    cache_path: Path | None = None
    fences: list[Any] = field(default_factory=list)
    descriptor_pools: list[Any] = field(default_factory=list)
    pools: list[Any] = field(default_factory=list)
    deferred: list[tuple[int, Callable[[], None]]] = field(default_factory=list)
    closed: bool = False


def _destroy(state: _State) -> None:
    vk = state.vk
    if state.closed or vk is None:
        return
    if state.device is not None:
        vk.vkDeviceWaitIdle(state.device)
        pending, state.deferred = state.deferred, []
        for _, fn in pending:
            fn()
    state.closed = True
    if state.device is not None:
        for pool in state.pools:
            pool.close()
        if state.pipeline_cache is not None:
            _save_pipeline_cache(state)
            vk.vkDestroyPipelineCache(state.device, state.pipeline_cache, None)
        for dpool in state.descriptor_pools:
            vk.vkDestroyDescriptorPool(state.device, dpool, None)
        for fence in state.fences:
            vk.vkDestroyFence(state.device, fence, None)
        if state.command_pool is not None:
            vk.vkDestroyCommandPool(state.device, state.command_pool, None)
        vk.vkDestroyDevice(state.device, None)
    if state.messenger is not None:
        destroy = vk.vkGetInstanceProcAddr(state.instance, "vkDestroyDebugUtilsMessengerEXT")
        destroy(state.instance, state.messenger, None)
    if state.instance is not None:
        vk.vkDestroyInstance(state.instance, None)


def _save_pipeline_cache(state: _State) -> None:
    if state.cache_path is None:
        return
    vk = state.vk
    size = vk.ffi.new("size_t*")
    vk.lib.vkGetPipelineCacheData(state.device, state.pipeline_cache, size, vk.ffi.NULL)
    data = vk.ffi.new("char[]", size[0])
    vk.lib.vkGetPipelineCacheData(state.device, state.pipeline_cache, size, data)
    tmp = state.cache_path.with_suffix(".tmp")
    tmp.write_bytes(vk.ffi.buffer(data, size[0])[:])
    os.replace(tmp, state.cache_path)


class Device:
    """One logical Vulkan device with a compute queue, a pipeline cache and memory pools.

    ``selector`` and ``validation`` default to ``TRACKER_VULKAN_DEVICE`` and
    ``TRACKER_VULKAN_VALIDATION``. ``pipeline_cache`` is an optional file the cache
    is loaded from and saved to on close. ``block_size`` is the memory pool's block.
    """

    def __init__(
        self,
        selector: str | int | None = None,
        *,
        validation: bool | None = None,
        pipeline_cache: str | Path | None = None,
        block_size: int = 64 << 20,
    ) -> None:
        self._state = _State()
        self._finalizer = weakref.finalize(self, _destroy, self._state)
        self._lock = threading.RLock()
        self._serial = 0
        self._done = 0
        self._inflight: deque[_Inflight] = deque()
        self._children: weakref.WeakSet[Any] = weakref.WeakSet()
        self._spare_buffers: list[Any] = []
        self._spare_descriptor_pools: list[Any] = []
        self.validation = validation_requested() if validation is None else validation
        try:
            self._open(os.environ.get(ENV_DEVICE) if selector is None else selector, pipeline_cache)
            from gpu.buffers import make_pools

            self.pools = make_pools(self, block_size)
            self._state.pools = list({id(p): p for p in self.pools.values()}.values())
        except BaseException:
            self._finalizer()
            raise

    # -- creation ----------------------------------------------------------------
    def _open(self, selector: str | int | None, cache_path: str | Path | None) -> None:
        vk = self.vk = self._state.vk = load_vulkan()
        st = self._state
        st.instance, messenger_info = _create_instance(vk, self.validation)
        if messenger_info is not None:
            create = vk.vkGetInstanceProcAddr(st.instance, "vkCreateDebugUtilsMessengerEXT")
            st.messenger = create(st.instance, messenger_info, None)
        physical = _physical_devices(vk, st.instance)
        self.info = choose([_describe(vk, pd, i) for i, pd in enumerate(physical)], selector)
        self.physical = physical[self.info.index]
        self.queue_family = self._compute_family()
        self._create_device()
        self.queue = vk.vkGetDeviceQueue(st.device, self.queue_family, 0)
        st.command_pool = vk.vkCreateCommandPool(st.device, vk.VkCommandPoolCreateInfo(
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue_family,
        ), None)
        st.cache_path = Path(cache_path) if cache_path is not None else None
        initial = st.cache_path.read_bytes() if st.cache_path and st.cache_path.exists() else b""
        info = vk.VkPipelineCacheCreateInfo(
            initialDataSize=len(initial), pInitialData=vk.ffi.from_buffer(initial) if initial else None,
        )
        st.pipeline_cache = vk.vkCreatePipelineCache(st.device, info, None)
        self.memory_properties = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        log.info("gpu: using %s (%s)", self.info.name, self.info.type)

    def _compute_family(self) -> int:
        vk = self.vk
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        compute = [i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
        if not compute:
            raise VulkanUnavailable(f"device {self.info.name!r} has no compute queue; choose another "
                                    f"with {ENV_DEVICE}")
        self.timestamp_bits = families[compute[0]].timestampValidBits
        return compute[0]

    def _create_device(self) -> None:
        vk, info = self.vk, self.info
        features = vk.VkPhysicalDeviceFeatures(
            shaderInt64=int(info.shader_int64), shaderFloat64=int(info.shader_float64),
        )
        s16 = vk.VkPhysicalDevice16BitStorageFeatures(storageBuffer16BitAccess=int(info.storage_buffer_16bit))
        queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.queue_family, queueCount=1,
                                           pQueuePriorities=[1.0])
        extensions = [HOST_IMPORT] if info.host_import_alignment else []
        create = vk.VkDeviceCreateInfo(
            pNext=vk.VkPhysicalDeviceFeatures2(pNext=s16, features=features),
            pQueueCreateInfos=[queue], ppEnabledExtensionNames=extensions or None,
        )
        self._state.device = vk.vkCreateDevice(self.physical, create, None)

    # -- properties --------------------------------------------------------------
    @property
    def handle(self) -> Any:
        """The VkDevice handle; raises ClosedError after ``close()``."""
        if self._state.closed:
            raise ClosedError(f"device {self.info.name!r} is closed; create a new gpu.Device")
        return self._state.device

    @property
    def closed(self) -> bool:
        """True after ``close()``."""
        return self._state.closed

    @property
    def pipeline_cache(self) -> Any:
        """The VkPipelineCache every pipeline of this device is created through."""
        return self._state.pipeline_cache

    @property
    def completed(self) -> int:
        """The highest submission serial known to have finished."""
        return self._done

    # -- submission --------------------------------------------------------------
    def command_buffer(self) -> Any:
        """A primary command buffer, begun for one-time submission."""
        vk = self.vk
        with self._lock:
            if self._spare_buffers:
                cb = self._spare_buffers.pop()
            else:
                cb = vk.vkAllocateCommandBuffers(self.handle, vk.VkCommandBufferAllocateInfo(
                    commandPool=self._state.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                    commandBufferCount=1,
                ))[0]
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        return cb

    def submit_nothing(self, command_buffer: Any) -> None:
        """Take back an ended command buffer that will not be submitted."""
        with self._lock:
            self.vk.vkResetCommandBuffer(command_buffer, 0)
            self._spare_buffers.append(command_buffer)

    def descriptor_pool(self) -> Any:
        """A descriptor pool for 64 sets of storage/uniform buffers (recycled after use)."""
        vk = self.vk
        with self._lock:
            if self._spare_descriptor_pools:
                return self._spare_descriptor_pools.pop()
            sizes = [vk.VkDescriptorPoolSize(type=getattr(vk, f"VK_DESCRIPTOR_TYPE_{kind}"), descriptorCount=count)
                     for kind, count in (("STORAGE_BUFFER", 64 * 16), ("UNIFORM_BUFFER", 64 * 4),
                                         ("UNIFORM_TEXEL_BUFFER", 64 * 8), ("STORAGE_TEXEL_BUFFER", 64 * 8))]
            pool = vk.vkCreateDescriptorPool(self.handle, vk.VkDescriptorPoolCreateInfo(
                maxSets=64, pPoolSizes=sizes), None)
            self._state.descriptor_pools.append(pool)
            return pool

    def recycle_descriptor_pool(self, pool: Any) -> None:
        """Reset a descriptor pool whose submission has finished and keep it for reuse."""
        with self._lock:
            self.vk.vkResetDescriptorPool(self.handle, pool, 0)
            self._spare_descriptor_pools.append(pool)

    def submit(self, command_buffer: Any, on_complete: list[Callable[[], None]] | None = None) -> int:
        """End and submit ``command_buffer``; return its serial. ``on_complete`` runs after its fence."""
        vk = self.vk
        vk.vkEndCommandBuffer(command_buffer)
        with self._lock:
            fence = self._state.fences.pop() if self._state.fences else \
                vk.vkCreateFence(self.handle, vk.VkFenceCreateInfo(), None)
            try:
                vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(pCommandBuffers=[command_buffer])], fence)
            except vk.VkErrorDeviceLost:
                raise DeviceLost(f"device {self.info.name!r} was lost on submit; recreate the Device") from None
            self._serial += 1
            self._inflight.append(_Inflight(self._serial, fence, command_buffer, list(on_complete or [])))
            return self._serial

    def wait(self, serial: int | None = None) -> None:
        """Block until submission ``serial`` (default: every submission) has finished."""
        with self._lock:
            target = self._serial if serial is None else serial
            self._retire(target)

    def poll(self) -> None:
        """Retire finished submissions without blocking and run the frees they released."""
        with self._lock:
            self._retire(0)

    def defer(self, serial: int, fn: Callable[[], None]) -> None:
        """Run ``fn`` once submission ``serial`` has finished (now, if it already has)."""
        with self._lock:
            if serial <= self._done:
                fn()
            else:
                self._state.deferred.append((serial, fn))

    def _retire(self, wait_for: int) -> None:
        vk = self.vk
        while self._inflight:
            item = self._inflight[0]
            try:
                if item.serial <= wait_for:
                    vk.vkWaitForFences(self.handle, 1, [item.fence], vk.VK_TRUE, _FENCE_TIMEOUT_NS)
                else:
                    vk.vkGetFenceStatus(self.handle, item.fence)
            except vk.VkNotReady:
                break
            except vk.VkTimeout:
                raise DeviceLost(f"submission {item.serial} did not finish in "
                                 f"{_FENCE_TIMEOUT_NS // 10**9} s on {self.info.name!r}") from None
            except vk.VkErrorDeviceLost:
                raise DeviceLost(f"device {self.info.name!r} was lost; recreate the Device") from None
            self._inflight.popleft()
            vk.vkResetFences(self.handle, 1, [item.fence])
            self._state.fences.append(item.fence)
            vk.vkResetCommandBuffer(item.command_buffer, 0)
            self._spare_buffers.append(item.command_buffer)
            self._done = item.serial
            for fn in item.on_complete:
                fn()
        ready = [fn for s, fn in self._state.deferred if s <= self._done]
        self._state.deferred = [(s, fn) for s, fn in self._state.deferred if s > self._done]
        for fn in ready:
            fn()

    # -- lifetime ----------------------------------------------------------------
    def adopt(self, child: Any) -> None:
        """Remember ``child`` (a buffer, pipeline, ...) so that ``close()`` closes it first."""
        self._children.add(child)

    def close(self) -> None:
        """Close every open child, wait for the GPU, run deferred frees, destroy. Idempotent."""
        if self._state.closed:
            return
        with self._lock:
            children = sorted(self._children, key=lambda c: not getattr(c, "close_first", False))
            for child in children:
                child.close()
            self.wait()
            self._finalizer()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<gpu.Device {self.info.name!r} ({self.info.type}) {state}>"
