"""Configuration for the reference store, source and receiver, in the product's own formats.

Two readers, one set of defaults:

* :mod:`.store_xml` reads a umestored XML file (DTD 1.0-1.3) into
  :class:`StoreDaemonConfig` and answers "which options does store S apply to topic T";
* :mod:`.client` reads a flat UM configuration file (``lbm.cfg`` style) into
  :class:`ContextOptions`, :class:`SourceOptions` and :class:`ReceiverOptions`;
* :mod:`.profiles` holds every default twice - ``current`` (UM 6.8+/6.17, the default) and
  ``guide-5.3`` (the seed guide) - because the product changed them and the harness must model
  both.

Reusing the product's formats means one configuration drives both the product and the reference
implementation in an interoperability run.  Every reader error is a :class:`ConfigError` with
file, line (and column for XML); anything accepted but noteworthy is a :class:`ConfigWarning` on
the result, never a print.
"""

from reference_impl.config.client import (
    ClientConfig,
    ContextOptions,
    NamedStore,
    ReceiverOptions,
    SourceOptions,
    StoreAddress,
    StoreGroup,
    UnicastResolverDaemon,
    load_client_config,
    parse_client_config,
    parse_session_id,
)
from reference_impl.config.profiles import (
    DEFAULT_PROFILE,
    ConfigError,
    ConfigWarning,
    Profile,
    get_profile,
    profile_differences,
    profile_names,
)
from reference_impl.config.store_xml import (
    DTD_VERSIONS,
    DaemonConfig,
    LogConfig,
    RestoreLast,
    StoreConfig,
    StoreDaemonConfig,
    TopicConfig,
    TopicOptions,
    WebMonitorAddress,
    dump_dtd,
    load_store_config,
    parse_store_config,
    validate_structure,
)

__all__ = [
    "DEFAULT_PROFILE",
    "DTD_VERSIONS",
    "ClientConfig",
    "ConfigError",
    "ConfigWarning",
    "ContextOptions",
    "DaemonConfig",
    "LogConfig",
    "NamedStore",
    "Profile",
    "ReceiverOptions",
    "RestoreLast",
    "SourceOptions",
    "StoreAddress",
    "StoreConfig",
    "StoreDaemonConfig",
    "StoreGroup",
    "TopicConfig",
    "TopicOptions",
    "UnicastResolverDaemon",
    "WebMonitorAddress",
    "dump_dtd",
    "get_profile",
    "load_client_config",
    "load_store_config",
    "parse_client_config",
    "parse_session_id",
    "parse_store_config",
    "profile_differences",
    "profile_names",
    "validate_structure",
]
