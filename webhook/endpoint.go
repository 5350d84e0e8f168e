package webhook

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/glob"
)

// ErrNotFound is returned for an endpoint ID that does not exist.
var ErrNotFound = errors.New("webhook: endpoint not found")

// ErrInvalidEndpoint is returned for endpoint parameters that cannot work,
// as an [*events.ValidationError] naming the field. A URL refused for its
// address (a private literal, or a number such as 127.1 that means one) also
// matches ErrForbiddenAddress.
var ErrInvalidEndpoint = errors.New("webhook: invalid endpoint")

// Endpoint is a registered receiver.
type Endpoint struct {
	ID          uuid.UUID
	URL         string
	Description string
	// Types selects events with globs, as events.Subscriber.Types.
	Types []string
	// Scopes lists the event scopes the endpoint receives; empty: all.
	Scopes []string
	// Headers are sent with every delivery.
	Headers map[string]string
	// SecretHeaders are sent with every delivery too, and sealed at rest:
	// their values read Redacted.
	SecretHeaders map[string]string
	// Secrets sign the deliveries: every one not yet expired. Their Secret
	// is in clear in what Create returns, Redacted everywhere else.
	Secrets []Secret
	// Timeout bounds one delivery; MaxInFlight how many run at once (in one
	// process).
	Timeout     time.Duration
	MaxInFlight int
	// RateLimit is at most how many requests per second the endpoint gets,
	// from all processes together; 0: no limit.
	RateLimit float64
	Enabled   bool
	// DisabledReason and DisabledAt say why and when it was disabled.
	DisabledReason string
	DisabledAt     time.Time
	// EnabledAt is when the endpoint was last enabled after a disable (zero
	// if never): deliveries created before it are cancelled, not sent.
	EnabledAt time.Time
	// FailingSince is the first failure since the last success; zero when
	// the last attempt succeeded.
	FailingSince  time.Time
	LastSuccessAt time.Time
	CreatedAt     time.Time
	UpdatedAt     time.Time

	// What the row stores, sealed: only deliveries (and Reseal) open it.
	sealed        []stored
	sealedHeaders map[string]stored
	health        health // read for deliveries only
}

// Secret is a signing secret ("whsec_…"). ExpiresAt is zero for the current
// one, and set on a secret replaced by RotateSecret, which signs alongside
// the new one until then.
type Secret struct {
	// Secret is Redacted except in what Create returns.
	Secret    string
	ExpiresAt time.Time
	// KeyID names the key of Config.Keys that seals it; empty when it is
	// stored in clear (Config.PlainSecrets).
	KeyID string
}

// EndpointParams are what Create and Update set.
type EndpointParams struct {
	URL         string
	Description string
	// Types selects events with globs. Required.
	Types []string
	// Scopes lists the scopes received; empty: all.
	Scopes []string
	// Headers are sent with every delivery. Names are RFC 9110 tokens, each
	// given once; values hold no control character but tab (no CR, LF or
	// NUL). Hop-by-hop headers, Host, Content-Type, Content-Length and the
	// webhook-* headers are refused.
	Headers map[string]string
	// Timeout defaults to TimeoutDefault (15 s); at most 1 min.
	Timeout time.Duration
	// MaxInFlight defaults to MaxInFlightDefault (10).
	MaxInFlight int
	// RateLimit caps the requests per second to the endpoint, counted for
	// all processes together in PostgreSQL (one UPDATE per delivery);
	// deliveries over it wait their turn without counting as tries. Sent
	// at their slot, they average RateLimit per second; when River wakes
	// waiting ones late (its FetchPollInterval), they still send in their
	// reserved slots' stead, so the average holds and a burst is at most a
	// poll interval's worth of the rate. 0, the default, is no limit.
	RateLimit float64
	// SecretHeaders are headers whose values are credentials (Authorization,
	// an API key): sent like Headers, under the same rules, but sealed at
	// rest and Redacted in Get and List. At Update, nil keeps the
	// endpoint's secret headers as they are; otherwise the map replaces
	// them, and a value of Redacted keeps that header's stored value.
	SecretHeaders map[string]string
	// Secret, at Create only: the signing secret; empty makes a new one.
	Secret string
}

// deniedHeaders may not be set by an endpoint.
var deniedHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length", "Content-Type",
	http.CanonicalHeaderKey(HeaderID), http.CanonicalHeaderKey(HeaderTimestamp), http.CanonicalHeaderKey(HeaderSignature)}

func (w *Webhooks) validate(p *EndpointParams) error {
	if _, err := w.guard.validateURL(p.URL); err != nil {
		// Err: a refused address also matches ErrForbiddenAddress.
		return &events.ValidationError{Kind: ErrInvalidEndpoint, Field: "URL", Reason: err.Error(), Err: err}
	}
	if len(p.Types) == 0 {
		return invalidEndpoint("Types", "is empty; give at least one glob, such as \"**\"")
	}
	for _, t := range p.Types {
		if _, err := glob.Compile(t); err != nil {
			return invalidEndpoint("Types", "%v", err)
		}
	}
	if err := validateHeaders(mergedHeaders(p.Headers, p.SecretHeaders)); err != nil {
		return err
	}
	if err := p.limits(); err != nil {
		return err
	}
	if p.Secret != "" {
		if _, err := secretKey(p.Secret); err != nil {
			return invalidEndpoint("Secret", "%v", err)
		}
	}
	if p.Scopes == nil {
		p.Scopes = []string{}
	}
	if p.Headers == nil {
		p.Headers = map[string]string{}
	}
	if p.SecretHeaders == nil {
		p.SecretHeaders = map[string]string{}
	}
	return nil
}

// invalidEndpoint is the error for a field of EndpointParams that cannot
// work.
func invalidEndpoint(field, format string, args ...any) error {
	return &events.ValidationError{Kind: ErrInvalidEndpoint, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// validateHeaders checks an endpoint's headers, plain and secret together:
// valid names and values, each name once, none that the delivery sets.
func validateHeaders(headers iter.Seq2[string, string]) error {
	seen := map[string]bool{}
	for name, value := range headers {
		canonical := http.CanonicalHeaderKey(name)
		switch {
		case !validHeaderName(name):
			return invalidEndpoint("Headers", "%q is not a header name (letters, digits and !#$%%&'*+-.^_`|~ only)", name)
		case !validHeaderValue(value):
			return invalidEndpoint("Headers", "%s: the value holds a control character (CR, LF, NUL …)", canonical)
		case seen[canonical]:
			return invalidEndpoint("Headers", "%s is given twice", canonical)
		case slices.Contains(deniedHeaders, canonical) || strings.HasPrefix(strings.ToLower(name), "webhook-"):
			return invalidEndpoint("Headers", "%q may not be set", name)
		}
		seen[canonical] = true
	}
	return nil
}

// limits fills p's Timeout and MaxInFlight where they are zero, and checks
// them and RateLimit.
func (p *EndpointParams) limits() error {
	if p.Timeout == 0 {
		p.Timeout = TimeoutDefault
	}
	if p.Timeout < 0 || p.Timeout > time.Minute {
		return invalidEndpoint("Timeout", "%v: must be between 0 and 1m", p.Timeout)
	}
	if p.MaxInFlight == 0 {
		p.MaxInFlight = MaxInFlightDefault
	}
	if p.MaxInFlight < 1 {
		return invalidEndpoint("MaxInFlight", "%d: must be at least 1", p.MaxInFlight)
	}
	if p.RateLimit < 0 || p.RateLimit > 1e6 || p.RateLimit != p.RateLimit {
		return invalidEndpoint("RateLimit", "%v: must be between 0 (none) and 1e6 per second", p.RateLimit)
	}
	return nil
}

// mergedHeaders iterates both maps, for validation.
func mergedHeaders(a, b map[string]string) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for _, m := range []map[string]string{a, b} {
			for k, v := range m {
				if !yield(k, v) {
					return
				}
			}
		}
	}
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range []byte(name) {
		token := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
		if !token {
			return false
		}
	}
	return true
}

// validHeaderValue reports whether value holds no control character but
// tab: CR and LF would split the request, NUL ends it for some servers.
func validHeaderValue(value string) bool {
	for _, c := range []byte(value) {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// scanEndpoint reads a row of the statements that return a whole endpoint
// (their columns are in webhook.sql's order), and then more.
func scanEndpoint(row pgx.Row, more ...any) (Endpoint, error) {
	var (
		e                                                Endpoint
		timeoutMS                                        int
		disabledAt, enabledAt, failingSince, lastSuccess *time.Time
	)
	err := row.Scan(append([]any{&e.ID, &e.URL, &e.Description, &e.Types, &e.Scopes, &e.Headers, &e.sealedHeaders, &e.sealed, &timeoutMS,
		&e.MaxInFlight, &e.RateLimit, &e.Enabled, &e.DisabledReason, &disabledAt, &enabledAt, &failingSince, &lastSuccess,
		&e.CreatedAt, &e.UpdatedAt}, more...)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, ErrNotFound
	}
	if err != nil {
		return Endpoint{}, err
	}
	e.Timeout = time.Duration(timeoutMS) * time.Millisecond
	e.Secrets = make([]Secret, len(e.sealed))
	for i, s := range e.sealed {
		e.Secrets[i] = Secret{Secret: Redacted, ExpiresAt: s.ExpiresAt, KeyID: s.KeyID}
	}
	e.SecretHeaders = make(map[string]string, len(e.sealedHeaders))
	for name := range e.sealedHeaders {
		e.SecretHeaders[name] = Redacted
	}
	for dst, src := range map[*time.Time]*time.Time{&e.DisabledAt: disabledAt, &e.EnabledAt: enabledAt, &e.FailingSince: failingSince, &e.LastSuccessAt: lastSuccess} {
		if src != nil {
			*dst = *src
		}
	}
	return e, nil
}

// Create registers an endpoint, enabled, with p.Secret or a new secret. The
// Endpoint it returns holds the signing secret in clear, to hand to the
// receiver: the only time it leaves the library (Get and List redact it).
// The secret and the secret headers are sealed under the first of
// Config.Keys; without keys, Create returns ErrNoKeys unless
// Config.PlainSecrets is set.
func (w *Webhooks) Create(ctx context.Context, p EndpointParams) (Endpoint, error) {
	if err := w.validate(&p); err != nil {
		return Endpoint{}, err
	}
	secret := p.Secret
	if secret == "" {
		secret = NewSecret()
	}
	id := uuid.Must(uuid.NewV7())
	sealed, err := w.keys.seal(id, fieldSecret, secret)
	if err != nil {
		return Endpoint{}, err
	}
	headers, err := w.sealHeaders(id, p.SecretHeaders, nil)
	if err != nil {
		return Endpoint{}, err
	}
	ep, err := scanEndpoint(w.pool.QueryRow(ctx, w.sql.CreateEndpoint, id, p.URL, p.Description, p.Types, p.Scopes, p.Headers, headers, []stored{sealed}, p.Timeout.Milliseconds(), p.MaxInFlight, p.RateLimit))
	if err != nil {
		return Endpoint{}, err
	}
	ep.Secrets[0].Secret = secret
	return public(ep, nil)
}

// sealHeaders seals secret header values for the row; a value of Redacted
// keeps the one in old.
func (w *Webhooks) sealHeaders(id uuid.UUID, values map[string]string, old map[string]stored) (map[string]stored, error) {
	out := make(map[string]stored, len(values))
	for name, v := range values {
		name = http.CanonicalHeaderKey(name)
		if v == Redacted {
			s, ok := old[name]
			if !ok {
				return nil, &events.ValidationError{Kind: ErrInvalidEndpoint, Field: "SecretHeaders", Reason: fmt.Sprintf("%s: %s keeps a stored value, and there is none", name, Redacted)}
			}
			out[name] = s
			continue
		}
		s, err := w.keys.seal(id, fieldHeader(name), v)
		if err != nil {
			return nil, err
		}
		out[name] = s
	}
	return out, nil
}

// Update changes an endpoint's URL, description, types, scopes, headers,
// secret headers (see EndpointParams.SecretHeaders), timeout and
// concurrency (not its secrets: see RotateSecret).
func (w *Webhooks) Update(ctx context.Context, id uuid.UUID, p EndpointParams) (Endpoint, error) {
	if p.Secret != "" {
		return Endpoint{}, &events.ValidationError{Kind: ErrInvalidEndpoint, Field: "Secret", Reason: "is set at Create; use RotateSecret"}
	}
	keep := p.SecretHeaders == nil
	if err := w.validate(&p); err != nil {
		return Endpoint{}, err
	}
	var ep Endpoint
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		var old map[string]stored
		if err := tx.QueryRow(ctx, w.sql.LockSecretHeaders, id).Scan(&old); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		headers := old
		if !keep {
			var err error
			if headers, err = w.sealHeaders(id, p.SecretHeaders, old); err != nil {
				return err
			}
		}
		var err error
		ep, err = public(scanEndpoint(tx.QueryRow(ctx, w.sql.UpdateEndpoint, id, p.URL, p.Description, p.Types, p.Scopes, p.Headers, headers, p.Timeout.Milliseconds(), p.MaxInFlight, p.RateLimit)))
		return err
	})
	return ep, err
}

// public drops what a delivery reads from an endpoint (its stored secrets,
// in clear under Config.PlainSecrets; its breaker) from one returned to the
// host, where fmt's %v and %+v, and slog, would print it.
func public(ep Endpoint, err error) (Endpoint, error) {
	ep.sealed, ep.sealedHeaders, ep.health = nil, nil, health{}
	return ep, err
}

// Get returns an endpoint, or ErrNotFound.
func (w *Webhooks) Get(ctx context.Context, id uuid.UUID) (Endpoint, error) {
	return public(scanEndpoint(w.pool.QueryRow(ctx, w.sql.GetEndpoint, id)))
}

// getForDelivery is Get with the endpoint's breaker. An endpoint without a
// health row (created after migration 005, during a rolling deploy, by a
// process of a release that wrote none) gets one, so that its breaker and
// rate limit work.
func (w *Webhooks) getForDelivery(ctx context.Context, id uuid.UUID) (Endpoint, error) {
	var (
		h   health
		has bool
	)
	ep, err := scanEndpoint(w.pool.QueryRow(ctx, w.sql.GetEndpointForDelivery, id), &h.failures, &h.openUntil, &h.probeUntil, &has)
	if err == nil && !has {
		_, err = w.pool.Exec(ctx, w.sql.CreateHealth, id)
	}
	ep.health = h
	return ep, err
}

// ListEndpointsResult is a page of endpoints, oldest first.
type ListEndpointsResult struct {
	Endpoints []Endpoint
	// Next is the After of the next page; zero on the last one.
	Next uuid.UUID
}

// List returns up to limit endpoints (default 50) created after the one
// with ID after (uuid.Nil for the first page).
func (w *Webhooks) List(ctx context.Context, after uuid.UUID, limit int) (ListEndpointsResult, error) {
	if limit <= 0 || limit > 1000 {
		limit = 50
	}
	rows, err := w.pool.Query(ctx, w.sql.ListEndpoints, after, limit+1)
	if err != nil {
		return ListEndpointsResult{}, err
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Endpoint, error) { return public(scanEndpoint(row)) })
	if err != nil {
		return ListEndpointsResult{}, err
	}
	var res ListEndpointsResult
	if len(list) > limit {
		list = list[:limit]
		res.Next = list[limit-1].ID
	}
	res.Endpoints = list
	return res, nil
}

// Disable stops deliveries to an endpoint, with a reason kept for
// operators. Its pending deliveries end as cancelled: Disable cancels them
// before it returns (in batches of cancelBatch), and one that was running
// meanwhile is cancelled when its retry comes, even after an Enable.
func (w *Webhooks) Disable(ctx context.Context, id uuid.UUID, reason string) error {
	if err := w.exec(ctx, w.sql.DisableEndpoint, id, reason); err != nil {
		return err
	}
	_, err := w.cancelPending(ctx, id)
	return err
}

// Enable resumes deliveries to an endpoint and forgets its failures. Events
// missed meanwhile, and deliveries pending at disable time, are not sent:
// see Recover.
func (w *Webhooks) Enable(ctx context.Context, id uuid.UUID) error {
	return w.exec(ctx, w.sql.EnableEndpoint, id)
}

// cancelBatch is how many deliveries one statement of cancelPending cancels.
const cancelBatch = 1000

// cancelPending cancels the deliveries to an endpoint that wait in River
// (available, scheduled, retryable, pending), cancelBatch per statement so
// that no statement holds many rows, and returns how many: those made
// before the endpoint was disabled (all of them once it is deleted; none
// once it is enabled again, when the worker cancels the old ones as they
// come), so that an Enable landing while it runs loses nothing made after
// it. Running ones are left to River: the worker cancels them when they
// come back. Disable has
// no River client to hand, so this is the update River's own JobCancel makes
// to a job that is not running.
func (w *Webhooks) cancelPending(ctx context.Context, endpoint uuid.UUID) (int64, error) {
	var total int64
	for {
		tag, err := w.pool.Exec(ctx, w.sql.CancelPending, endpoint.String(), cancelBatch)
		if err != nil {
			return total, fmt.Errorf("webhook: cancelling the deliveries to %s: %w", endpoint, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < cancelBatch {
			return total, nil
		}
	}
}

// RotateSecret adds a new secret and returns it, in clear (the only time it
// leaves the library); the current ones keep signing alongside it until
// grace has passed (SecretGraceDefault, 24 h, when grace is zero), so
// receivers can switch without missing a delivery. The new secret is
// sealed as at Create.
func (w *Webhooks) RotateSecret(ctx context.Context, id uuid.UUID, grace time.Duration) (string, error) {
	if grace <= 0 {
		grace = SecretGraceDefault
	}
	secret := NewSecret()
	sealed, err := w.keys.seal(id, fieldSecret, secret)
	if err != nil {
		return "", err
	}
	err = pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		var current []stored
		if err := tx.QueryRow(ctx, w.sql.LockSecrets, id).Scan(&current); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		now := time.Now()
		kept := []stored{sealed}
		for _, s := range current {
			switch {
			case s.ExpiresAt.IsZero():
				s.ExpiresAt = now.Add(grace)
				kept = append(kept, s)
			case s.ExpiresAt.After(now):
				kept = append(kept, s)
			}
		}
		_, err := tx.Exec(ctx, w.sql.SetSecrets, id, kept)
		return err
	})
	if err != nil {
		return "", err
	}
	return secret, nil
}

// Delete removes an endpoint; its pending deliveries end as cancelled. The
// attempt log keeps its entries until retention.
func (w *Webhooks) Delete(ctx context.Context, id uuid.UUID) error {
	if err := w.exec(ctx, w.sql.DeleteEndpoint, id); err != nil {
		return err
	}
	_, err := w.cancelPending(ctx, id)
	return err
}

func (w *Webhooks) exec(ctx context.Context, sql string, args ...any) error {
	tag, err := w.pool.Exec(ctx, sql, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// matchesType reports whether the endpoint takes an event of type t (its
// scopes are matched in SQL).
func (e *Endpoint) matchesType(t string) bool {
	for _, pattern := range e.Types {
		if p, err := glob.Compile(pattern); err == nil && p.Match(t) {
			return true
		}
	}
	return false
}
