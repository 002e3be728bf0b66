# Builds the image of the operator, of lockstepd (/lockstepd) and of the KubeVirt hook
# (/lockstep-kubevirt-hook) with a container engine: docker build -t lockstep-operator .
# `make images` builds the same image without one and without a base image (hack/imagebuild,
# tested by make test-images): the three binaries at /, user 65532:65532, /lockstep-operator as the
# entrypoint. Keep the two alike; distroless adds CA certificates and time zones, which lockstep
# does not read.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/lockstep-operator ./cmd/lockstep-operator && \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/lockstepd ./cmd/lockstepd && \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/lockstep-kubevirt-hook ./cmd/lockstep-kubevirt-hook

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/lockstep-operator /lockstep-operator
COPY --from=build /out/lockstepd /lockstepd
COPY --from=build /out/lockstep-kubevirt-hook /lockstep-kubevirt-hook
USER 65532:65532
ENTRYPOINT ["/lockstep-operator"]
