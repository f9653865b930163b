package retry_test

import (
	"math"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/retry"
)

// almostOne is the largest float64 below 1: the top of a [0, 1) random source.
var almostOne = math.Nextafter(1, 0)

func TestPolicyDelay(t *testing.T) {
	t.Parallel()
	p := retry.Policy{}.WithDefaults() // 200 ms ×2 up to 10 s, jitter 0.2
	ms := time.Millisecond
	tests := []struct {
		name   string
		retry  int
		random float64
		want   time.Duration
	}{
		{"no wait before the first attempt", 0, 0.5, 0},
		{"negative retry", -3, 0.5, 0},
		{"first retry, middle of the spread", 1, 0.5, 200 * ms},
		{"first retry, bottom of the spread", 1, 0, 160 * ms},
		{"first retry, top of the spread", 1, almostOne, 240 * ms},
		{"second retry doubles", 2, 0.5, 400 * ms},
		{"third retry", 3, 0.5, 800 * ms},
		{"fourth retry", 4, 0.5, 1600 * ms},
		{"fourth retry, bottom", 4, 0, 1280 * ms},
		{"fourth retry, top", 4, almostOne, 1920 * ms},
		{"fifth retry", 5, 0.5, 3200 * ms},
		{"sixth retry", 6, 0.5, 6400 * ms},
		{"seventh retry reaches the cap", 7, 0.5, 10 * time.Second},
		{"capped, bottom of the spread", 7, 0, 8 * time.Second},
		{"capped, top of the spread", 7, almostOne, 12 * time.Second},
		{"far past the cap", 1000, 0.5, 10 * time.Second},
		{"random below 0 is clamped", 1, -5, 160 * ms},
		{"random of 1 or more is clamped", 1, 7, 240 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, p.Delay(tt.retry, tt.random))
		})
	}

	t.Run("the top of the spread stays at or below d×(1+Jitter)", func(t *testing.T) {
		for retry := 1; retry <= 10; retry++ {
			mid := p.Delay(retry, 0.5)
			top := p.Delay(retry, almostOne)
			require.LessOrEqual(t, top, time.Duration(float64(mid)*1.2), "retry %d", retry)
			require.Greater(t, top, time.Duration(float64(mid)*1.2)-time.Microsecond, "retry %d", retry)
		}
	})

	t.Run("negative jitter turns jitter off", func(t *testing.T) {
		p := retry.Policy{Jitter: -1}.WithDefaults()
		for _, r := range []float64{0, 0.5, almostOne} {
			require.Equal(t, 400*ms, p.Delay(2, r))
		}
	})

	t.Run("multiplier 1 keeps the wait constant", func(t *testing.T) {
		p := retry.Policy{Multiplier: 1, Jitter: -1, InitialInterval: time.Second}.WithDefaults()
		for retry := 1; retry <= 20; retry++ {
			require.Equal(t, time.Second, p.Delay(retry, 0.5))
		}
	})

	t.Run("no overflow with huge intervals", func(t *testing.T) {
		p := retry.Policy{InitialInterval: time.Hour, MaxInterval: math.MaxInt64, Multiplier: 10}.WithDefaults()
		for _, retry := range []int{1, 10, 100, math.MaxInt32} {
			for _, r := range []float64{0, 0.5, almostOne} {
				d := p.Delay(retry, r)
				require.Positive(t, d, "retry %d random %v", retry, r)
			}
		}
		require.Equal(t, time.Duration(math.MaxInt64), p.Delay(1000, almostOne))
	})
}

func TestPolicyWithDefaults(t *testing.T) {
	t.Parallel()
	require.Equal(t, retry.Policy{
		MaxAttempts:     retry.MaxAttemptsDefault,
		InitialInterval: retry.InitialIntervalDefault,
		MaxInterval:     retry.MaxIntervalDefault,
		Multiplier:      retry.MultiplierDefault,
		Jitter:          retry.JitterDefault,
		MaxElapsedTime:  retry.MaxElapsedTimeDefault,
	}, retry.Policy{}.WithDefaults())

	set := retry.Policy{MaxAttempts: 2, InitialInterval: time.Second, MaxInterval: 3 * time.Second, Multiplier: 1.5, Jitter: -1, MaxElapsedTime: -1}
	require.Equal(t, set, set.WithDefaults(), "set fields, negative ones included, are kept")

	require.Equal(t, time.Minute, retry.Policy{InitialInterval: time.Minute}.WithDefaults().MaxInterval,
		"the default MaxInterval is never below InitialInterval")

	require.NoError(t, retry.Policy{}.WithDefaults().Validate())
	require.NoError(t, set.Validate())

	// The default budget stays well below the PostgreSQL queue's 30 s ack deadline.
	def := retry.Policy{}.WithDefaults()
	var worst time.Duration
	for r := 1; r < def.MaxAttempts; r++ {
		worst += def.Delay(r, almostOne)
	}
	require.Equal(t, 3600*time.Millisecond, worst)
	require.Less(t, worst, def.MaxElapsedTime)
	require.Less(t, def.MaxElapsedTime, 30*time.Second)
}

func TestPolicyValidate(t *testing.T) {
	t.Parallel()
	valid := retry.Policy{}.WithDefaults()
	tests := []struct {
		name   string
		change func(p *retry.Policy)
		field  string
		msg    string
	}{
		{"no attempt", func(p *retry.Policy) { p.MaxAttempts = 0 },
			"MaxAttempts", "retry: invalid policy: MaxAttempts is 0; it must be at least 1"},
		{"negative attempts", func(p *retry.Policy) { p.MaxAttempts = -2 },
			"MaxAttempts", "MaxAttempts is -2; it must be at least 1"},
		{"zero initial interval", func(p *retry.Policy) { p.InitialInterval = 0 },
			"InitialInterval", "InitialInterval is 0s; it must be positive"},
		{"negative initial interval", func(p *retry.Policy) { p.InitialInterval = -time.Second },
			"InitialInterval", "InitialInterval is -1s; it must be positive"},
		{"max below initial", func(p *retry.Policy) { p.MaxInterval = 100 * time.Millisecond },
			"MaxInterval", "MaxInterval is 100ms; it must be at least InitialInterval (200ms)"},
		{"shrinking multiplier", func(p *retry.Policy) { p.Multiplier = 0.5 },
			"Multiplier", "Multiplier is 0.5; it must be a finite number of at least 1"},
		{"NaN multiplier", func(p *retry.Policy) { p.Multiplier = math.NaN() },
			"Multiplier", "Multiplier is NaN; it must be a finite number"},
		{"infinite multiplier", func(p *retry.Policy) { p.Multiplier = math.Inf(1) },
			"Multiplier", "Multiplier is +Inf; it must be a finite number"},
		{"jitter of 1", func(p *retry.Policy) { p.Jitter = 1 },
			"Jitter", "Jitter is 1; it must be below 1"},
		{"jitter above 1", func(p *retry.Policy) { p.Jitter = 1.5 },
			"Jitter", "Jitter is 1.5; it must be below 1 (0.2 spreads each wait over ±20%; a negative value turns jitter off)"},
		{"NaN jitter", func(p *retry.Policy) { p.Jitter = math.NaN() },
			"Jitter", "Jitter is NaN; it must be below 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := valid
			tt.change(&p)
			err := p.Validate()
			require.ErrorIs(t, err, retry.ErrInvalidConfig)
			var perr *retry.PolicyError
			require.ErrorAs(t, err, &perr)
			require.Equal(t, tt.field, perr.Field)
			require.Contains(t, err.Error(), tt.msg)
		})
	}

	t.Run("every problem is reported", func(t *testing.T) {
		err := retry.Policy{Jitter: 2}.Validate() // nothing defaulted
		require.ErrorIs(t, err, retry.ErrInvalidConfig)
		for _, field := range []string{"MaxAttempts", "InitialInterval", "Multiplier", "Jitter"} {
			require.Contains(t, err.Error(), field+" is ")
		}
		require.NotContains(t, err.Error(), "MaxInterval is ", "0 is not below an InitialInterval of 0")
		require.Len(t, err.(interface{ Unwrap() []error }).Unwrap(), 4)
	})

	t.Run("Middleware refuses a bad policy", func(t *testing.T) {
		_, err := retry.Middleware(retry.Config{
			Policy:         retry.Policy{MaxAttempts: -1},
			DeadLetterFunc: func(*message.Message, error) error { return nil },
		})
		require.ErrorIs(t, err, retry.ErrInvalidConfig)
		require.Contains(t, err.Error(), "MaxAttempts is -1")
	})
}
