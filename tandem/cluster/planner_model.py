"""The planner's own timing model, kept apart from the engine's truth: another profile (`--planner-profile`) and a
perturbation that scales every step time (`--planner-profile-scale 0.7` = the model thinks the engine 30% faster
than it is). Pure: it builds new profiles and never touches the one the simulated engines run."""

from dataclasses import replace

from engines.timing.profile import ProfileError, TimingProfile, load_profile


def scale_profile(profile: TimingProfile, factor: float) -> TimingProfile:
    """`profile` with every prefill and decode step time multiplied by `factor` (capacity and limits kept)."""
    if not factor > 0:
        raise ProfileError(f"a profile scale must be > 0, got {factor}")
    if factor == 1.0:
        return profile
    return replace(
        profile,
        name=f"{profile.name} x{factor:g}",
        prefill_ms_coeffs=tuple(c * factor for c in profile.prefill_ms_coeffs),
        decode_ms_coeffs=tuple(c * factor for c in profile.decode_ms_coeffs),
        min_step_ms=profile.min_step_ms * factor,
        prefill_ms_points=tuple((x, ms * factor) for x, ms in profile.prefill_ms_points),
        decode_ms_points=tuple((b, c, ms * factor) for b, c, ms in profile.decode_ms_points),
    )


def parse_scales(text: str) -> tuple[float, ...]:
    """ "0.7,1,1.3" -> (0.7, 1.0, 1.3); each must be > 0."""
    try:
        scales = tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ProfileError(f"--planner-profile-scale {text!r}: expected numbers separated by commas") from None
    if not scales or min(scales) <= 0:
        raise ProfileError(f"--planner-profile-scale {text!r}: every scale must be > 0")
    return scales


def planner_profiles(
    truth: TimingProfile, name_or_path: str | None, scales: tuple[float, ...]
) -> dict[str, TimingProfile]:
    """One model per scale, keyed "x0.7", "x1" ...: the named profile (else the truth) with its times scaled."""
    base = load_profile(name_or_path) if name_or_path else truth
    return {f"x{s:g}": scale_profile(base, s) for s in scales}
