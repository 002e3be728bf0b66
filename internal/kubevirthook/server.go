package kubevirthook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lockstep-dev/lockstep/internal/kubevirthook/api/info"
	"github.com/lockstep-dev/lockstep/internal/kubevirthook/api/plugins"
	"github.com/lockstep-dev/lockstep/internal/kubevirthook/api/v1alpha3"
)

// onDefineDomain is the hook point the sidecar serves.
const onDefineDomain = "OnDefineDomain"

// Sidecar serves the hook sidecar's protocol: the handshake and the v1alpha3 callbacks.
type Sidecar struct {
	info.UnimplementedInfoServer
	v1alpha3.UnimplementedCallbacksServer
	Hook *Hook
}

// Info tells virt-launcher what the hook serves.
func (s *Sidecar) Info(context.Context, *info.InfoParams) (*info.InfoResult, error) {
	return &info.InfoResult{Name: Name, Versions: []string{"v1alpha3"}, HookPoints: []*info.HookPoint{{Name: onDefineDomain}}}, nil
}

// OnDefineDomain returns the member's domain.
func (s *Sidecar) OnDefineDomain(_ context.Context, p *v1alpha3.OnDefineDomainParams) (*v1alpha3.OnDefineDomainResult, error) {
	out, err := s.Hook.Mutate(p.GetDomainXML(), p.GetVmi())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &v1alpha3.OnDefineDomainResult{DomainXML: out}, nil
}

// PreCloudInitIso leaves cloud-init as it is (the hook does not announce this point).
func (s *Sidecar) PreCloudInitIso(_ context.Context, p *v1alpha3.PreCloudInitIsoParams) (*v1alpha3.PreCloudInitIsoResult, error) {
	return &v1alpha3.PreCloudInitIsoResult{CloudInitNoCloudSource: p.GetCloudInitNoCloudSource(), CloudInitData: p.GetCloudInitData()}, nil
}

// Shutdown has nothing to clean up.
func (s *Sidecar) Shutdown(context.Context, *v1alpha3.ShutdownParams) (*v1alpha3.ShutdownResult, error) {
	return &v1alpha3.ShutdownResult{}, nil
}

// Plugin serves the Plugins API's domain hook.
type Plugin struct {
	plugins.UnimplementedDomainHookServiceServer
	Hook *Hook
}

// Invocation contexts of the Plugins API.
const (
	invocationBoot            = "Boot"
	invocationMigrationTarget = "MigrationTarget"
)

// MutateDomain returns the member's domain at boot. A member is never live-migrated: COLO pairs
// it with a secondary on another node, and a migration would run a third copy, so the hook
// refuses a migration target (with the Plugin's failureStrategy Fail, the migration fails).
func (p *Plugin) MutateDomain(_ context.Context, r *plugins.MutateDomainRequest) (*plugins.MutateDomainResponse, error) {
	if t := r.GetDomainType(); t != "" && t != "libvirt" {
		return nil, status.Errorf(codes.InvalidArgument, "domain type %q: the hook mutates libvirt domains", t)
	}
	switch r.GetSidecarContext().GetInvocationContext() {
	case "", invocationBoot:
	case invocationMigrationTarget:
		if _, _, member, err := p.Hook.member(r.GetVmi()); err != nil || member {
			return nil, status.Error(codes.FailedPrecondition, "a fault tolerant VM's member is never live-migrated: lockstep replaces it on another node instead")
		}
		return &plugins.MutateDomainResponse{Domain: r.GetDomain()}, nil
	default:
		return &plugins.MutateDomainResponse{Domain: r.GetDomain()}, nil
	}
	out, err := p.Hook.Mutate(r.GetDomain(), r.GetVmi())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &plugins.MutateDomainResponse{Domain: out}, nil
}

// Serve serves the sidecar protocol on sidecarSocket and the plugin protocol on pluginSocket
// (either may be empty) until ctx ends.
func Serve(ctx context.Context, h *Hook, sidecarSocket, pluginSocket string) error {
	if sidecarSocket == "" && pluginSocket == "" {
		return errors.New("no socket to serve: give the sidecar's or the plugin's")
	}
	errs := make(chan error, 2)
	n := 0
	for _, sock := range []string{sidecarSocket, pluginSocket} {
		if sock == "" {
			continue
		}
		srv := grpc.NewServer()
		if sock == sidecarSocket {
			sc := &Sidecar{Hook: h}
			info.RegisterInfoServer(srv, sc)
			v1alpha3.RegisterCallbacksServer(srv, sc)
		} else {
			plugins.RegisterDomainHookServiceServer(srv, &Plugin{Hook: h})
		}
		ln, err := listen(sock)
		if err != nil {
			return err
		}
		n++
		go func() { errs <- srv.Serve(ln) }()
		context.AfterFunc(ctx, srv.Stop)
	}
	var err error
	for range n {
		err = errors.Join(err, <-errs)
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func listen(sock string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		return nil, err
	}
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", sock, err)
	}
	return ln, nil
}
