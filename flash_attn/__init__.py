__version__ = "2.8.3"

from flash_attn.flash_attn_interface import (
    check_index_errors,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
    set_strict_checks,
    strict_checks_enabled,
)

__all__ = [
    "__version__",
    "check_index_errors",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "set_strict_checks",
    "strict_checks_enabled",
]
