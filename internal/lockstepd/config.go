package lockstepd

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/internal/channel"
	"github.com/lockstep-dev/lockstep/internal/ftlog"
	"github.com/lockstep-dev/lockstep/internal/nodecert"
	"github.com/lockstep-dev/lockstep/internal/relay"
	"github.com/lockstep-dev/lockstep/internal/term"
)

// Config is lockstepd's configuration: flags, each also settable by an environment variable
// LOCKSTEPD_<FLAG> (upper case, dashes as underscores); a flag given on the command line wins.
type Config struct {
	NodeName string
	// ListenAddress is where the FT log is served; AdvertiseAddress is what peers dial (the
	// node's logging-network address), published on the Node.
	ListenAddress, AdvertiseAddress string
	// LoggingInterface is the node's (or lockstepd pod's) interface on the logging network, for
	// example the Multus attachment of its pod: lockstepd listens and advertises there only.
	LoggingInterface string
	// StreamListenAddress is where an engine's own streams are relayed; StreamAdvertiseAddress
	// is what peers dial for them (default: the advertised host, the stream listener's port).
	StreamListenAddress, StreamAdvertiseAddress string
	// RunDir holds the members' directories (<run-dir>/<vmi-uid>/), which their launchers share
	// with the node: lockstepd's QMP monitor of the member's QEMU and its stream sockets.
	RunDir string
	// LauncherUser is the user (uid:gid) the members' QEMU runs as, to whom lockstepd gives each
	// member's directory and the sockets it makes there: KubeVirt's launcher runs QEMU as 107
	// (its non-root default); empty where QEMU runs as root (KubeVirt's Root feature gate).
	LauncherUser string
	// MemberDirLabel is the SELinux label of the members' directories where the node runs
	// SELinux ("": left as made).
	MemberDirLabel string
	// CertFile, KeyFile and CAFile are the node's certificate, its key and the CA that signs
	// every node's. Files are read again when they change.
	CertFile, KeyFile, CAFile string
	// CertRequest: lockstepd obtains and renews its certificate from the operator's signer
	// (CertificateSigningRequests for nodecert.SignerName); otherwise the files are provided.
	CertRequest bool
	// CertLifetime is the lifetime lockstepd asks of its certificates.
	CertLifetime         time.Duration
	Heartbeat, Timeout   time.Duration
	Detect, ClaimTimeout time.Duration
	// RecordTerm is the pair's record's term (internal/term): a side that runs the VM and could
	// not renew the record for it, less its margin, pauses its VM.
	RecordTerm     time.Duration
	StatusInterval time.Duration
	WindowEntries  int
	WindowBytes    int
	// PaceThreshold: the primary is slowed while the vLockstep interval stays above it (0: never).
	PaceThreshold                 time.Duration
	MetricsAddress, HealthAddress string
	// GateHook is where the kernel gate catches the VM's packets ("forward" for a tap on a
	// bridge, "output" for a VM in the host's own stack).
	GateHook string
	// Engine names the VM engine.
	Engine string
	// Namespace is lockstepd's own, where it keeps its node lease (ftv1.NodeLeaseName).
	Namespace string
	// ReprotectionTimeout bounds how long a restarted lockstepd stays unready while the VMs its
	// node held are not protected again (reprotection.go; 0: no bound).
	ReprotectionTimeout time.Duration
}

// ClaimAttemptTimeout bounds one attempt at the pair's record (a claim, a read): half the claim
// timeout, so that a slow API server that answers within it decides the claim, and a lost
// answer leaves time for a second attempt, which finds the first one's write. (A fixed second
// made a winner under a slow API server fence itself.)
func (c *Config) ClaimAttemptTimeout() time.Duration { return max(time.Second, c.ClaimTimeout/2) }

// DefaultConfig is the configuration with every flag at its default.
func DefaultConfig() Config {
	var c Config
	c.BindFlags(flag.NewFlagSet("defaults", flag.ContinueOnError))
	return c
}

// BindFlags defines the flags.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.NodeName, "node-name", "", "Name of this node (required; the DaemonSet passes spec.nodeName).")
	fs.StringVar(&c.ListenAddress, "listen-address", ":7410", "Address the FT log is served on.")
	fs.StringVar(&c.AdvertiseAddress, "advertise-address", "", "ip:port peers dial for this node's FT logs, on the logging network (required without --logging-interface).")
	fs.StringVar(&c.LoggingInterface, "logging-interface", "", "Interface on the logging network (e.g. the pod's Multus attachment): listeners without a host bind to its address, which is advertised unless --advertise-address says otherwise.")
	fs.StringVar(&c.StreamListenAddress, "stream-listen-address", ":7411", "Address an engine's own streams (QEMU COLO's) are relayed on.")
	fs.StringVar(&c.StreamAdvertiseAddress, "stream-advertise-address", "", "ip:port peers dial for this node's streams (default: the --advertise-address host with the --stream-listen-address port).")
	fs.StringVar(&c.RunDir, "run-dir", "/var/run/lockstep", "Directory of the members' directories (<run-dir>/<vmi-uid>/), shared with their launchers; keep it short: Unix socket paths end at 107 bytes.")
	fs.StringVar(&c.LauncherUser, "launcher-user", "107:107", "uid:gid the members' QEMU runs as (KubeVirt's non-root launcher: 107:107), given each member's directory and lockstepd's sockets there; empty when QEMU runs as root.")
	fs.StringVar(&c.MemberDirLabel, "member-dir-selinux-label", DefaultMemberDirLabel, "SELinux label each member's directory gets where the node runs SELinux, so that the launcher's QEMU (container_t) may use it (empty: left as made, under --run-dir's label).")
	fs.StringVar(&c.CertFile, "tls-cert-file", "/var/lib/lockstepd/pki/tls.crt", "The node's certificate (PEM); its common name must be system:lockstepd:<node-name>.")
	fs.StringVar(&c.KeyFile, "tls-key-file", "/var/lib/lockstepd/pki/tls.key", "The node's private key (PEM).")
	fs.StringVar(&c.CAFile, "tls-ca-file", "/etc/lockstepd/ca/ca.crt", "The CA that signs every lockstepd's certificate (PEM; the operator publishes it in the ConfigMap lockstepd-ca).")
	fs.BoolVar(&c.CertRequest, "tls-request-certificate", true, "Obtain and renew the node's certificate from the operator's signer (CertificateSigningRequest, signer "+nodecert.SignerName+") into --tls-cert-file and --tls-key-file; false: the files are provided.")
	fs.DurationVar(&c.CertLifetime, "tls-certificate-lifetime", 7*24*time.Hour, "Lifetime to ask of the node's certificates; lockstepd renews at two thirds of it.")
	fs.DurationVar(&c.Heartbeat, "heartbeat", channel.DefaultHeartbeat, "How often an idle side proves it is alive.")
	fs.DurationVar(&c.Timeout, "timeout", channel.DefaultTimeout, "Silence after which a connection is dropped and reopened.")
	fs.DurationVar(&c.Detect, "detect", 500*time.Millisecond, "Silence of the peer after which a side claims the pair's Lease.")
	fs.DurationVar(&c.ClaimTimeout, "claim-timeout", 5*time.Second, "How long a side tries to reach the Lease before it fences itself.")
	fs.DurationVar(&c.RecordTerm, "record-term", term.Default, "Term of the pair's record (a lease): the side that runs the VM renews it every fifth of it, and pauses its VM when it could not renew for five sixths of it (stops it at eleven twelfths); the operator starts the VM elsewhere only once a whole term (and 2% and 2 s) passed without a renewal.")
	fs.DurationVar(&c.StatusInterval, "status-interval", 5*time.Second, "How often a pair's FaultTolerantVM status is refreshed (state changes are reported at once).")
	fs.IntVar(&c.WindowEntries, "window-entries", ftlog.DefaultWindow.Entries, "Flow control: unacknowledged entries before the primary waits.")
	fs.IntVar(&c.WindowBytes, "window-bytes", ftlog.DefaultWindow.Bytes, "Flow control: unacknowledged bytes before the primary waits.")
	fs.DurationVar(&c.PaceThreshold, "pace-threshold", 100*time.Millisecond, "Slow the primary while the vLockstep interval stays above this (0: never).")
	fs.StringVar(&c.MetricsAddress, "metrics-bind-address", ":9410", "Prometheus metrics address (0: off).")
	fs.StringVar(&c.HealthAddress, "health-probe-bind-address", ":9411", "Health and readiness probes address (0: off).")
	fs.StringVar(&c.GateHook, "gate-hook", "forward", "Where the kernel gate catches VM packets: forward or output.")
	fs.StringVar(&c.Engine, "engine", "", "VM engine.")
	fs.DurationVar(&c.ReprotectionTimeout, "reprotection-timeout", 30*time.Minute, "After a restart, lockstepd is not ready (a rollout of its DaemonSet waits) until the VMs its node held protected when it stopped are protected again, for at most this long (0: no limit).")
	fs.StringVar(&c.Namespace, "namespace", "lockstep-system", "lockstepd's namespace (the DaemonSet passes metadata.namespace), where it renews its node lease, lockstepd-<node-name>.")
}

// FromEnv sets every flag not given on the command line from its LOCKSTEPD_* variable.
func FromEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		env := "LOCKSTEPD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok && !given[f.Name] {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", env, err))
			}
		}
	})
	return errors.Join(errs...)
}

// MemberDir is a member's directory on the node, which its launcher shares with lockstepd:
// <run-dir>/<vmi-uid>.
func (c *Config) MemberDir(m MemberSpec) string { return filepath.Join(c.RunDir, m.UID) }

// LauncherOwner is --launcher-user (nil: QEMU runs as root, or the flag is malformed, which
// Validate refuses).
func (c *Config) LauncherOwner() *relay.Owner {
	o, _ := relay.ParseOwner(c.LauncherUser)
	return o
}

// Validate says what is missing or wrong.
func (c *Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("--node-name is required"))
	}
	if err := c.resolveLoggingInterface(); err != nil {
		errs = append(errs, err)
	}
	if c.AdvertiseAddress == "" {
		errs = append(errs, errors.New("--advertise-address or --logging-interface is required (this node's address on the logging network)"))
	}
	if c.StreamAdvertiseAddress == "" && c.AdvertiseAddress != "" {
		host, _, err := net.SplitHostPort(c.AdvertiseAddress)
		_, port, perr := net.SplitHostPort(c.StreamListenAddress)
		if err != nil || perr != nil {
			errs = append(errs, fmt.Errorf("cannot derive --stream-advertise-address from %q and %q: give it", c.AdvertiseAddress, c.StreamListenAddress))
		} else {
			c.StreamAdvertiseAddress = net.JoinHostPort(host, port)
		}
	}
	if c.RunDir == "" {
		errs = append(errs, errors.New("--run-dir is required"))
	}
	if _, err := relay.ParseOwner(c.LauncherUser); err != nil {
		errs = append(errs, fmt.Errorf("--launcher-user %w", err))
	}
	if c.Detect <= c.Heartbeat {
		errs = append(errs, fmt.Errorf("--detect (%s) must exceed --heartbeat (%s)", c.Detect, c.Heartbeat))
	}
	if c.RecordTerm < term.Min {
		errs = append(errs, fmt.Errorf("--record-term (%s) must be at least %s", c.RecordTerm, term.Min))
	} else if pauseMargin := term.Term(c.RecordTerm).HolderMargin(); c.Detect+c.ClaimTimeout >= c.RecordTerm-pauseMargin {
		// A claim must be decided well within the term, or a side that won it could lapse at once.
		errs = append(errs, fmt.Errorf("--record-term (%s) must exceed --detect plus --claim-timeout (%s) by more than a sixth of itself", c.RecordTerm, c.Detect+c.ClaimTimeout))
	}
	if c.GateHook != "forward" && c.GateHook != "output" {
		errs = append(errs, fmt.Errorf("--gate-hook %q: want forward or output", c.GateHook))
	}
	return errors.Join(errs...)
}

// resolveLoggingInterface binds lockstepd to the logging network: with --logging-interface, the
// FT log and stream listeners that name no host listen on that interface's address only, and
// the advertised addresses not given are that address. Nothing of the pairs' traffic then uses
// the node's other networks.
func (c *Config) resolveLoggingInterface() error {
	if c.LoggingInterface == "" {
		return nil
	}
	ip, err := interfaceAddress(c.LoggingInterface)
	if err != nil {
		return fmt.Errorf("--logging-interface %s: %w", c.LoggingInterface, err)
	}
	var errs []error
	bind := func(flagName string, addr *string) {
		host, port, err := net.SplitHostPort(*addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s %q: %w", flagName, *addr, err))
			return
		}
		if host == "" {
			*addr = net.JoinHostPort(ip.String(), port)
		}
	}
	bind("listen-address", &c.ListenAddress)
	bind("stream-listen-address", &c.StreamListenAddress)
	if c.AdvertiseAddress == "" {
		c.AdvertiseAddress = c.ListenAddress // the stream address follows it (Validate)
	}
	return errors.Join(errs...)
}

// interfaceAddress is the first IPv4 address of the interface (else its first IPv6 one).
func interfaceAddress(name string) (net.IP, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return nil, err
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return nil, err
	}
	var v6 net.IP
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if v4 := ipn.IP.To4(); v4 != nil {
			return v4, nil
		}
		if v6 == nil && !ipn.IP.IsLinkLocalUnicast() {
			v6 = ipn.IP
		}
	}
	if v6 == nil {
		return nil, errors.New("the interface has no address")
	}
	return v6, nil
}

// ChannelConfig is the channel configuration of a pair.
func (c *Config) ChannelConfig(pair string, tc *tls.Config) channel.Config {
	return channel.Config{Pair: pair, TLS: tc, Heartbeat: c.Heartbeat, Timeout: c.Timeout,
		Window: ftlog.Window{Entries: c.WindowEntries, Bytes: c.WindowBytes}}
}
