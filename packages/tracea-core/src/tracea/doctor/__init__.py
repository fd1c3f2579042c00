"""The Doctor (L3): capability profiler, variant registry and decision engine."""

from .decision import Candidate, Decision, FrameworkFaster, Rejection
from .doctor import Doctor, get_doctor, reset_doctor
from .profile import DeviceProfile
from .registry import VariantRegistry
from .variant import KernelVariant, OpArgs, Requirements

__all__ = ["Candidate", "Decision", "DeviceProfile", "Doctor", "FrameworkFaster", "KernelVariant", "OpArgs",
           "Rejection", "Requirements", "VariantRegistry", "get_doctor", "reset_doctor"]
